"""The quantization schemes a user can ask for, one class each (see `base.py` for what a scheme owns).

Every module of this package but `base` (what a scheme owns) registers its schemes on import; this
file imports them all, so a new scheme is one new module here, found without editing any list.
"""

from __future__ import annotations

import importlib
import pkgutil

from weightsmith.schemes.base import REGISTRY, Alloc, Scheme, Write, fresh, make_scheme

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

#: Every command-line scheme name, in registration order.
SCHEME_NAMES = tuple(REGISTRY)

__all__ = ["REGISTRY", "SCHEME_NAMES", "Alloc", "Scheme", "Write", "fresh", "make_scheme"]
