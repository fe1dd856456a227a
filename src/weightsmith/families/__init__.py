"""The architecture families weightsmith knows, one class each (see `base.py` for what a family states).

Every module of this package but `base` registers its family on import; this file imports them all,
so a new family is one new module here, found without editing any list.
"""

from __future__ import annotations

import importlib
import pkgutil

from weightsmith.families.base import (
    FAMILIES,
    Experts,
    Family,
    Router,
    by_architecture,
    family_of,
    register,
    require_family,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["FAMILIES", "Experts", "Family", "Router", "by_architecture", "family_of", "register", "require_family"]
