"""The scale searches a user can ask for (`--scale-search`, a recipe's `scale_search`), one class each.

Every module of this package but `base` registers its searches on import; this file imports them all,
so a new search is one new module here (plus its kernel in `quant/`), found without editing any list:
the command's help, `make_scheme`'s checks, GPTQ's refusals, the kernel warm-up and the card all read
the registry.
"""

from __future__ import annotations

import importlib
import pkgutil

from weightsmith.searches.base import (
    NONE,
    SEARCHES,
    ClipSearch,
    ParameterSearch,
    ScaleSearch,
    TensorSearch,
    gptq_starts,
    register,
    searches_for,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "NONE",
    "SEARCHES",
    "ClipSearch",
    "ParameterSearch",
    "ScaleSearch",
    "TensorSearch",
    "gptq_starts",
    "register",
    "searches_for",
]
