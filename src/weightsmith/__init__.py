"""weightsmith: serving-ready LLM checkpoints from raw safetensors, and the evidence for them.

The library entry points (`weightsmith.quantize(SRC, OUT, ...)`, `weightsmith.plan_quantize(SRC, ...)`
and the rest of `weightsmith.api`) are imported on first use, so that the command line starts without
loading the quantize kernels. A type checker sees their real signatures.
"""

#: `typing.TYPE_CHECKING` without importing typing: `python -m weightsmith` runs this file before the
#: command line can answer Ctrl-C with one line (`__main__`), so it imports next to nothing (not even
#: `__future__`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from weightsmith.api import plan_quantize as plan_quantize
    from weightsmith.api import quantize as quantize
else:
    # The quantize flow is the package `weightsmith.quantize`; the library call of the same name is the
    # function below. Importing the (empty) package first means no later submodule import rebinds the name.
    from weightsmith import quantize as _flow_package

    del _flow_package

    def quantize(*args, **kwargs):
        from weightsmith.api import quantize as run

        return run(*args, **kwargs)

    def __getattr__(name):
        if name in _API:
            from weightsmith import api

            return getattr(api, name)
        raise AttributeError(f"module 'weightsmith' has no attribute {name!r}")


from weightsmith.core.version import __version__  # noqa: E402

_API = ("plan_quantize",)
__all__ = ["__version__", "plan_quantize", "quantize"]
