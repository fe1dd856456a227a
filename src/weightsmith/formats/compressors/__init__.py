"""The compressed-tensors formats, one registered class each (see `base.py` for what a format owns).

Every module of this package registers its formats on import; this file imports them all, so a new
format is one new module here, found without editing any list.
"""

from __future__ import annotations

import importlib
import pkgutil

from weightsmith.formats.compressors.base import REGISTRY, Compressor, decompress, layout_of, of_group, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Compressor", "decompress", "layout_of", "of_group", "register"]
