"""weightsmith: serving-ready LLM checkpoints from raw safetensors, and the evidence for them.

`weightsmith.quantize(SRC, OUT, ...)` and `weightsmith.plan_quantize(SRC, ...)` are the library entry
points (see `weightsmith.api`); they are imported on first use, so that the command line starts
without loading the quantize kernels.
"""

#: `typing.TYPE_CHECKING` without importing typing: `python -m weightsmith` runs this file before the
#: command line can answer Ctrl-C with one line (`__main__`), so it imports nothing at all (not even
#: `__future__`, hence the quoted annotation below).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "plan_quantize", "quantize"]


def __getattr__(name: str) -> "Any":
    if name in ("quantize", "plan_quantize"):
        from weightsmith import api

        return getattr(api, name)
    raise AttributeError(f"module 'weightsmith' has no attribute {name!r}")
