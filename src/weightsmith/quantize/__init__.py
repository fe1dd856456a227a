"""The quantize flow: recipe, plan, config groups, the pipeline that writes, the manifest, GPTQ and the command.

The package is also the library call: `weightsmith.quantize(SRC, OUT, ...)` is `quantize.library.quantize`
(a type checker sees that function's signature through weightsmith/__init__.py). One name serves both
because the flow's modules are `weightsmith.quantize.*` and the call was `weightsmith.quantize` first; a
callable package keeps `import weightsmith.quantize.plan`, `from weightsmith import quantize` and
`mock.patch("weightsmith.quantize.pipeline....")` working whichever is imported first.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from weightsmith.quantize.library import quantize

        return quantize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
