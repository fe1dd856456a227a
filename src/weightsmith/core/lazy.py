"""A module imported at its first use, so that a command's `--help` does not start numba.

The quantize kernels are numba functions, compiled or loaded from numba's cache as their module is
imported; numba's own import costs some 0.3 s. Modules that hold a registry a command line lists
(schemes, scale searches, pre-passes) name the kernel modules with `lazy_module`: the name is bound
at once, the module is imported when one of its attributes is first read.

numpy and ml_dtypes (0.1 s between them) are bound the same way in the modules a command's `--help`
imports, and in those `inspect` needs to read headers: the module uses them only inside its
functions, and binds them as

    if TYPE_CHECKING:
        import numpy as np
    else:
        np = lazy_module("numpy")

so that type checkers still see the real module. Kernel modules import numpy itself: numba resolves
a jitted function's globals when it compiles, and knows numpy, not a stand-in for it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module `name` until an attribute is read, then for the real module (every read
    goes to it, so a test that patches the module's attribute is seen). `importlib.import_module`
    holds the import lock: threads that first read at once import the module once."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """The module `name` if it is imported already, else a `LazyModule` that imports it on first use."""
    module = sys.modules.get(name)
    return module if module is not None else LazyModule(name)
