"""The pre-passes a user can ask for (`--pre-pass`), one class each: transforms of the weights before they
are quantized that leave the model's function unchanged.

Every module of this package but `base` registers its pre-passes on import; this file imports them all,
so a new pre-pass is one new module here, found without editing any list: the request's checks, the plan,
the pipeline, the command's help and the card read the registry.
"""

from __future__ import annotations

import importlib
import pkgutil

from weightsmith.quantization.prepasses.base import PRE_PASSES, PrePass, Transform, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PRE_PASSES", "PrePass", "Transform", "register"]
