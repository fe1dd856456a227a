"""What the card reads from each JSON file, checked before anything is written or compared.

Every source is a file a stranger may have edited (or a run of an older or newer tool may have
written), so each field the card reads is declared here with its type. A missing field or a wrong
type is one line naming the file and the field (`eval.json: logits.kl is a string, not an integer
or a number`), never a traceback from deep inside the renderer. When the card reads a new field, it
is added here. The manifest is not declared here: `weightsmith.io.manifest.Manifest` is its typed
record, and reading one checks it with the same wording.

A spec is a type or tuple of types (`int` never accepts a bool, `float` also takes an int, `None`
allows null), a `dict` of field specs (a key ending in `?` may be absent), `[spec]` for a list of
one kind, `Each(spec)` for an object whose keys are free and whose values share one spec, or
`Bounded(low, high)` for a number that must lie in a range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import short_repr


@dataclass(frozen=True)
class Each:
    """An object with free keys (shard names, categories) whose values all match `spec`."""

    spec: Any


@dataclass(frozen=True)
class Bounded:
    """A number (an integer when `integer`) from `low` to `high`: what a measurement can be at all.

    A KL of -5 or a top-1 agreement of 1.7 is not a measurement, and a card must not publish one.
    """

    low: float
    high: float = math.inf
    integer: bool = False

    @property
    def kinds(self) -> tuple[type, ...]:
        return (int,) if self.integer else (int, float)

    def holds(self, value: float) -> bool:
        finite = isinstance(value, int) or math.isfinite(value)  # an int of 5,000 digits has no float
        return finite and self.low <= value <= self.high

    def words(self) -> str:
        return f"at least {self.low:g}" if self.high == math.inf else f"from {self.low:g} to {self.high:g}"


NUM = (int, float)
OPT_NUM = (int, float, None)
OPT_STR = (str, None)

_ARGS = ({"num_bits?": (int, None), "type?": OPT_STR, "dynamic?": (bool, str, None)}, None)
CONFIG = {
    "architectures?": ([str], None),
    "dflash_config?": ({"target_layer_ids?": ([int], None), "target_model?": OPT_STR}, None),
    "target_model?": OPT_STR,
    "target_model_name_or_path?": OPT_STR,
    "num_hidden_layers?": (int, None),
    "quantization_config?": (
        {"kv_cache_scheme?": _ARGS, "config_groups?": (Each({"input_activations?": _ARGS}), None)},
        None,
    ),
}

#: `weightsmith preflight --json` output (what the card keeps of it), and the card's kept copy.
PREFLIGHT = {
    "schema": str,
    "vllm": {"version": str},
    "method": OPT_STR,
    "passed": bool,
    "counts": Each(int),
}
PREFLIGHT_KEPT = {"runs": [{"vllm": str, "method": OPT_STR, "passed": bool, "counts": Each(int)}]}

COUNT = Bounded(0, integer=True)
_SUMMARY = {"name": str, "layers": COUNT, "numel": Bounded(0), "rel_mse": (Bounded(0), None), "sqnr_db": OPT_NUM}
EVAL = {
    "weights": {
        "categories": [_SUMMARY],
        "overall": _SUMMARY,
        "original_grid?": {"blocks": COUNT, "on_4bit_grid": COUNT},
    },
    "logits": {"status": str, "reason?": OPT_STR},
}
#: Read only when `logits.status` is "ok".
EVAL_LOGITS_OK = {
    "tokens": COUNT,
    "text_source": str,
    # KL is never negative; a float64 sum of terms that cancel may round a hair below 0
    "kl": Bounded(-1e-9),
    "top1_agreement": Bounded(0, 1),
    # exp of a cross-entropy, itself never negative
    "ppl_orig": Bounded(1),
    "ppl_quant": Bounded(1),
}

_BITS = {"bits_per_param": OPT_NUM, "bits_with_overhead": OPT_NUM}
INSPECT = {
    "rows": [{"key": str, "tensors": int, "bytes": NUM, "share": NUM, "params": NUM, **_BITS}],
    "tensors": int,
    "tensor_bytes": NUM,
    "params": NUM,
    "bits_per_param": OPT_NUM,
    "file_bytes": NUM,
    "shards": int,
    "quantization?": ({"statuses": [{"status": str, "modules": int, "patterns": [{"pattern": str}]}]}, None),
}

VERIFY = {
    "clean": bool,
    "errors": int,
    "warnings": int,
    "checks": [{"id": str, "title": str, "scope": str, "ran": bool, "errors": int, "warnings": int}],
    "findings": [{"severity": str, "message": str}],
}


_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "list": "a list",
          "dict": "an object"}  # fmt: skip


def _kind(value: Any) -> str:
    return "null" if value is None else _WORDS.get(type(value).__name__, type(value).__name__)


def _matches_type(value: Any, allowed: tuple[Any, ...]) -> bool:
    for t in allowed:
        if t is None and value is None:
            return True
        if isinstance(t, type) and isinstance(value, t):
            # bool is an int in Python but not in JSON; an int is a fine float
            if t in (int, float) and isinstance(value, bool):
                continue
            return True
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            return True
    return False


def check(value: Any, spec: Any, file: str | Path, path: str = "") -> None:
    """Raise a one-line `WeightsmithError` naming `file` and the field where `value` breaks `spec`."""
    where = path or "the top level"
    options = spec if isinstance(spec, tuple) else (spec,)
    # the first option whose shape fits is checked in depth; plain types are checked directly
    for option in options:
        if isinstance(option, dict) and isinstance(value, dict):
            for key, sub in option.items():
                name = key.rstrip("?")
                if name not in value:
                    if key.endswith("?"):
                        continue
                    raise WeightsmithError(f"has no field {_join(path, name)}", file=file, code="card.field")
                check(value[name], sub, file, _join(path, name))
            return
        if isinstance(option, list) and isinstance(value, list):
            for i, item in enumerate(value):
                check(item, option[0], file, f"{path}[{i}]")
            return
        if isinstance(option, Each) and isinstance(value, dict):
            for key, item in value.items():
                check(item, option.spec, file, f"{path}[{key}]")
            return
    if _matches_type(value, tuple(o for o in options if o is None or isinstance(o, type))):
        return
    for option in options:
        if isinstance(option, Bounded) and _matches_type(value, option.kinds):
            if option.holds(value):
                return
            raise WeightsmithError(
                f"{where} is {short_repr(value, 40)}, out of range: it must be {option.words()}",
                file=file,
                code="card.field",
            )
    raise WeightsmithError(f"{where} is {_kind(value)}, not {_expected(options)}", file=file, code="card.field")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _expected(options: tuple[Any, ...]) -> str:
    words = []
    for o in options:
        if o is None:
            words.append("null")
        elif isinstance(o, dict | Each):
            words.append("an object")
        elif isinstance(o, list):
            words.append("a list")
        elif isinstance(o, Bounded):
            words.append(_expected(o.kinds))
        else:
            words.append(_WORDS.get(o.__name__, o.__name__))
    return " or ".join(dict.fromkeys(words))


def check_eval(doc: dict[str, Any], file: str | Path) -> None:
    """An eval report: the fields every card reads, and the logits figures when it says they were measured."""
    check(doc, EVAL, file)
    if doc["logits"]["status"] == "ok":
        check(doc["logits"], EVAL_LOGITS_OK, file, "logits")
    grid = doc["weights"].get("original_grid")
    if grid and grid["on_4bit_grid"] > grid["blocks"]:
        raise WeightsmithError(
            f"weights.original_grid.on_4bit_grid is {grid['on_4bit_grid']}, more than the "
            f"{grid['blocks']} blocks sampled",
            file=file,
            code="card.field",
        )
