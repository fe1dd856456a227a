"""weightsmith: serving-ready LLM checkpoints from raw safetensors, and the evidence for them.

The library entry points (`weightsmith.quantize(SRC, OUT, ...)`, `plan_quantize`, `calibrate`,
`calibrate_kv`, `verify` and `evaluate`: `weightsmith.api`, docs/api.md) are imported on first use, so
that the command line starts without loading numpy or the quantize kernels. A type checker sees their
real signatures (the `TYPE_CHECKING` imports below; the package ships `py.typed`).
"""

#: `typing.TYPE_CHECKING` without importing typing: `python -m weightsmith` runs this file before the
#: command line can answer Ctrl-C with one line (`__main__`), so it imports next to nothing (not even
#: `__future__`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from weightsmith.api import calibrate as calibrate
    from weightsmith.api import calibrate_kv as calibrate_kv
    from weightsmith.api import evaluate as evaluate
    from weightsmith.api import plan_quantize as plan_quantize
    from weightsmith.api import quantize as quantize
    from weightsmith.api import verify as verify
else:
    # The quantize flow is the package `weightsmith.quantize`; the library call of the same name is the
    # function below. Importing the (empty) package first means no later submodule import rebinds the name.
    from weightsmith import quantize as _flow_package

    del _flow_package

    def quantize(*args, **kwargs):
        """`weightsmith.api.quantize`: quantize the checkpoint folder SRC into OUT (imported on first call)."""
        from weightsmith.api import quantize as run

        return run(*args, **kwargs)

    # `import weightsmith.quantize.recipe as recipe` looks the submodule up as an attribute of
    # `weightsmith.quantize` (this function), then in sys.modules under that attribute's `__name__`
    # plus ".recipe": named after the package, the lookup finds the submodule.
    quantize.__name__ = "weightsmith.quantize"

    def __getattr__(name):
        if name in _API:
            from weightsmith import api

            return getattr(api, name)
        raise AttributeError(f"module 'weightsmith' has no attribute {name!r}")


from weightsmith.core.version import __version__  # noqa: E402

#: The entry points other than `quantize` (a function above, as the flow package holds its name), looked
#: up in `weightsmith.api` on first use by the module `__getattr__`.
_API = ("calibrate", "calibrate_kv", "evaluate", "plan_quantize", "verify")
__all__ = ["__version__", "calibrate", "calibrate_kv", "evaluate", "plan_quantize", "quantize", "verify"]
