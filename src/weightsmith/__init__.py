"""weightsmith: serving-ready LLM checkpoints from raw safetensors, and the evidence for them.

The library entry points (`weightsmith.quantize(QuantizeRequest(SRC, OUT, ...))`, `plan_quantize`,
`calibrate`, `calibrate_kv`, `verify` and `evaluate`: `weightsmith.api`, docs/api.md) are imported on
first use, so that the command line starts without loading numpy or the quantize kernels. A type checker
and `help()` see their real signatures (the `TYPE_CHECKING` imports below; the package ships `py.typed`).
The quantize flow itself is the package `weightsmith.quantization`.
"""

#: `typing.TYPE_CHECKING` without importing typing: `python -m weightsmith` runs this file before the
#: command line can answer Ctrl-C with one line (`__main__`), so it imports nothing at all (not even
#: `__future__`; an interrupt landing in an import of ours printed a traceback through our file).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from weightsmith.api import BudgetOptions as BudgetOptions
    from weightsmith.api import GptqOptions as GptqOptions
    from weightsmith.api import Hooks as Hooks
    from weightsmith.api import QuantizeRequest as QuantizeRequest
    from weightsmith.api import calibrate as calibrate
    from weightsmith.api import calibrate_kv as calibrate_kv
    from weightsmith.api import evaluate as evaluate
    from weightsmith.api import plan_quantize as plan_quantize
    from weightsmith.api import quantize as quantize
    from weightsmith.api import verify as verify
    from weightsmith.core.version import __version__ as __version__
else:

    def __getattr__(name):
        if name == "__version__":
            from weightsmith.core.version import __version__

            return __version__
        if name in _API:
            from weightsmith import api

            return getattr(api, name)
        raise AttributeError(f"module 'weightsmith' has no attribute {name!r}")


#: The entry points and the request's types, looked up in `weightsmith.api` on first use.
_API = (
    "BudgetOptions",
    "GptqOptions",
    "Hooks",
    "QuantizeRequest",
    "calibrate",
    "calibrate_kv",
    "evaluate",
    "plan_quantize",
    "quantize",
    "verify",
)
__all__ = ["__version__", *_API]
