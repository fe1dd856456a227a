"""What each candidate costs each module, measured on a CPU: three measures, one table.

Every candidate that quantizes is run for real, uniformly (`quantize` with its scheme over the whole
scope: the SINQ pre-pass and the scale search included where the candidate takes them), and each
module's error is taken from what was written: the stored weight dequantized by our decompressors,
mapped back through the pre-pass's folds (`W_eff = deq / cols / rows`, the function the checkpoint
computes, in the source's coordinates), minus the source weight. `dW = 0` for a weight kept as stored.
Three measures of that error, cheapest first:

- `weight` (data-free): the summed squared error, `sum dW^2`.
- `activation` (calibrated): the squared error the module adds to its output per token,
  `sum_i E[x_i^2] sum_o dW_oi^2` (the diagonal of the inputs' second moment, as GPTQ's Hessian).
- `fisher` (calibrated, the default): the KL divergence per token the error adds to the model's
  next-token distribution, to second order, `1/2 sum F_oi dW_oi^2 / tokens`, with `F` the diagonal
  of the model's Fisher information. `F` is estimated without bias from gradients of labels sampled
  from the model's own predictions (`draws` per sequence): for a label y_t drawn from p(.|x_<=t) the
  expected squared gradient of log p(y_t) is the Fisher, and gradients of different positions are
  uncorrelated, so a sequence's summed gradient, squared, estimates the sum over its tokens.

The sum over modules of a measure is the model's predicted cost (each module measured alone: an
error's effect on later layers is in `fisher`, not in the others). `compare` in the study holds each
measure against the KL measured with one layer quantized at a time.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.io import names
from weightsmith.quantization.budget.candidates import Candidate, group_of

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: The measures, in the order the table lists them; `fisher` is the default.
MEASURES = ("fisher", "activation", "weight")
CALIBRATED = ("fisher", "activation")
#: Label samples per calibration sequence for the Fisher estimate.
DRAWS = 2
#: A table is about 500 bytes per module: a file larger than this is not one.
MAX_TABLE_BYTES = 1 << 28
#: What a table file is; a file of another form is refused.
FORM = "weightsmith-sensitivity-v1"


@dataclass
class ModuleCost:
    """One module: its shape and dtype, and per measure, per candidate label, its cost (absent: the
    candidate cannot take it)."""

    module: str
    shape: tuple[int, int]
    dtype: str
    cost: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def params(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass
class Table:
    """Every module of the scope with its costs, and how they were measured."""

    source: str
    fingerprint: str
    family: str
    candidates: tuple[str, ...]
    measures: tuple[str, ...]
    tokens: int
    text: str | None
    modules: list[ModuleCost]
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"form": FORM} | asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: Path) -> Table:
        if not isinstance(doc, dict) or doc.get("form") != FORM:
            raise WeightsmithError(f"is not a sensitivity table ({FORM})", file=where, code="usage")
        try:
            modules = [
                ModuleCost(m["module"], (int(m["shape"][0]), int(m["shape"][1])), str(m["dtype"]),
                           {k: {c: _cost_value(v) for c, v in costs.items()} for k, costs in m["cost"].items()})
                for m in doc["modules"]
            ]  # fmt: skip
            return cls(
                str(doc["source"]), str(doc["fingerprint"]), str(doc["family"]), tuple(doc["candidates"]),
                tuple(doc["measures"]), int(doc["tokens"]), doc.get("text"), modules, dict(doc.get("seconds", {})),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise WeightsmithError(f"is not a sensitivity table ({type(exc).__name__}: {exc})", file=where,
                                   code="usage") from None  # fmt: skip

    def groups(self) -> dict[str, list[ModuleCost]]:
        """Modules by the layer vLLM builds them into (one choice each), in the table's order."""
        out: dict[str, list[ModuleCost]] = {}
        for m in self.modules:
            out.setdefault(group_of(m.module), []).append(m)
        return out


def _cost_value(value: object) -> float:
    """A cost read from a table: a finite number, not negative (a measure is a sum of squares)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"cost {value!r} is not a finite number >= 0")
    return float(value)


def read_table(path: Path) -> Table:
    from weightsmith.core.files import read_text_file

    text = read_text_file(path, MAX_TABLE_BYTES, "sensitivity table", code="usage")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise WeightsmithError("is not JSON", file=path, code="usage") from None
    return Table.from_json(doc, path)


def fingerprint(headers: Mapping[str, tuple[str, tuple[int, ...]]]) -> str:
    """A digest of the scope's names, dtypes and shapes: a table measured on another checkpoint differs."""
    digest = hashlib.sha256()
    for name in sorted(headers):
        dtype, shape = headers[name]
        digest.update(f"{name} {dtype} {list(shape)}\n".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Calibration:
    """Where the calibrated measures' tokens come from (`--text`/`--builtin`), how many, in sequences of `seq_len`."""

    text: str | None = None
    builtin: str | None = None
    tokens: int = 2048
    seq_len: int = 256
    draws: int = DRAWS
    seed: int = 0


def measure(
    source: Path,
    scope: dict[str, tuple[tuple[int, int], str]],
    cands: tuple[Candidate, ...],
    family: str,
    *,
    measures: tuple[str, ...] = MEASURES,
    calibration: Calibration = Calibration(),
    request_fields: dict[str, Any] | None = None,
    workers: int = 1,
    say: Callable[[str], None] | None = None,
) -> Table:
    """The cost of every candidate for every module of `scope` (module -> (shape, source dtype)).

    `request_fields`: what the uniform runs share with the request (`ignore`, `preset`...)."""
    say = say or (lambda _line: None)
    seconds: dict[str, float] = {}
    stats: Stats | None = None
    tokens = 0
    if any(m in CALIBRATED for m in measures):
        started = time.perf_counter()
        stats = statistics(source, scope, calibration, workers, say)
        tokens = stats.tokens
        seconds["statistics"] = time.perf_counter() - started
    modules = {m: ModuleCost(m, shape, dtype) for m, (shape, dtype) in scope.items()}
    with tempfile.TemporaryDirectory(prefix="ws-budget-") as work:
        for c in cands:
            started = time.perf_counter()
            if c.scheme is None:
                for m in modules.values():
                    for k in measures:
                        m.cost.setdefault(k, {})[c.label] = 0.0
                continue
            say(f"{c.label}: quantizing every module to measure its error")
            errors = _errors(source, Path(work) / c.label, c, set(scope), request_fields or {}, workers)
            for module, dw in errors:
                m = modules[module]
                for k in measures:
                    m.cost.setdefault(k, {})[c.label] = _cost(k, module, dw, stats)
            seconds[c.label] = time.perf_counter() - started
    headers = {m: (dtype, shape) for m, (shape, dtype) in scope.items()}
    text = None
    if stats is not None:
        text = str(calibration.text) if calibration.text else f"builtin:{calibration.builtin or 'code'}"
    return Table(
        str(source), fingerprint(headers), family, tuple(c.label for c in cands), tuple(measures), tokens, text,
        list(modules.values()), {k: round(v, 3) for k, v in seconds.items()},
    )  # fmt: skip


def _cost(kind: str, module: str, dw: np.ndarray, stats: Stats | None) -> float:
    sq = np.square(dw, dtype=np.float64) if dw.dtype != np.float64 else np.square(dw)
    if kind == "weight":
        return float(sq.sum())
    assert stats is not None
    if kind == "activation":
        return float(sq.sum(axis=0) @ stats.inputs[module])
    return float(0.5 * np.einsum("oi,oi->", sq, stats.fisher[module], dtype=np.float64) / stats.tokens)


def _errors(
    source: Path, out: Path, c: Candidate, scope: set[str], fields: dict[str, Any], workers: int
) -> Iterator[tuple[str, np.ndarray]]:
    """Each quantized module's error under candidate `c` run uniformly, in the source's coordinates, one
    module at a time (only one error is held at once)."""
    from weightsmith.formats.declaration import quantized_modules
    from weightsmith.formats.dequantize import dequantize
    from weightsmith.formats.source import OriginalWeights, TensorReader
    from weightsmith.io.checkpoint import Checkpoint
    from weightsmith.quantization.library import plan as make_plan
    from weightsmith.quantization.library import write
    from weightsmith.quantization.prepasses import PRE_PASSES
    from weightsmith.quantization.request import QuantizeRequest

    request = QuantizeRequest(
        source, out, scheme=c.scheme, group_size=c.group_size, workers=workers, hash_sources=False, **fields
    )
    made = make_plan(request)
    balance = PRE_PASSES[made.pre_pass].run(made, workers) if made.pre_pass is not None else None
    write(made)
    quant = Checkpoint.open(out)
    with OriginalWeights(Checkpoint.open(source)) as original, TensorReader(quant) as reader:
        for qm in quantized_modules(quant):
            if qm.module not in scope:
                continue
            deq = dequantize(qm, reader).astype(np.float32)
            name = f"{qm.module}.{names.WEIGHT}"
            if balance is not None:
                cols = getattr(balance, "cols", {}).get(name)
                rows = getattr(balance, "rows", {}).get(name)
                if cols is not None:
                    deq /= cols[None, :]
                if rows is not None:
                    deq /= rows[:, None]
            deq -= original.weight(qm.module).astype(np.float32)
            yield qm.module, deq


@dataclass
class Stats:
    """Per module: the mean square of each input column over the tokens, and the Fisher diagonal summed
    over them (float32, the weight's shape)."""

    tokens: int
    inputs: dict[str, np.ndarray]
    fisher: dict[str, np.ndarray]


def statistics(
    source: Path,
    scope: dict[str, tuple[tuple[int, int], str]],
    calibration: Calibration,
    workers: int,
    say: Callable[[str], None],
) -> Stats:
    """The inputs' second moments and the Fisher diagonal of every module in `scope`, from one forward
    and `draws` backward passes per calibration sequence of the source model in float32 (torch and
    transformers)."""
    from weightsmith.fidelity.logits import REQUIRED_LIBRARIES, missing_library

    missing = missing_library(REQUIRED_LIBRARIES)
    if missing is not None:
        raise WeightsmithError(f"the calibrated measures need {missing}; or use --measure weight", code="usage")
    import torch
    from transformers import AutoModelForCausalLM

    from weightsmith.calibration.measure import calibration_tokens

    read = calibration_tokens(source, calibration.text, calibration.builtin, calibration.tokens, calibration.seq_len)
    torch.set_num_threads(max(1, workers))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.eval()
    linears = {name: mod for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    missing_modules = sorted(set(scope) - set(linears))
    if missing_modules:
        raise WeightsmithError(
            f"{missing_modules[0]} is not a torch Linear in the model transformers builds (routed experts often "
            "are one fused tensor): the calibrated measures read Linears only; use --measure weight",
            file=source,
            code="budget.measure",
        )
    for p in model.parameters():
        p.requires_grad_(False)
    inputs = {m: torch.zeros(linears[m].in_features, dtype=torch.float64) for m in scope}
    fisher = {m: torch.zeros_like(linears[m].weight) for m in scope}
    hooks = []
    for m in scope:
        weight = linears[m].weight
        weight.requires_grad_(True)

        def accumulate(p: Any, acc: Any = fisher[m]) -> None:
            acc.add_(p.grad.square())
            p.grad = None

        def record(_mod: Any, args: Any, _out: Any, acc: Any = inputs[m]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1])
            acc.add_(x.double().square().sum(0))

        hooks.append(weight.register_post_accumulate_grad_hook(accumulate))  # type: ignore[no-untyped-call]
        hooks.append(linears[m].register_forward_hook(record))
    generator = torch.Generator().manual_seed(calibration.seed)
    tokens = 0
    try:
        for number, ids in enumerate(read.sequences, 1):
            batch = torch.tensor([ids])
            logits = model(input_ids=batch).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            for draw in range(calibration.draws):
                labels = torch.multinomial(logp.detach().exp(), 1, generator=generator)[:, 0]
                loss = -logp.gather(1, labels[:, None]).sum()
                loss.backward(retain_graph=draw + 1 < calibration.draws)  # type: ignore[no-untyped-call]
            tokens += len(ids)
            say(f"statistics: sequence {number}/{len(read.sequences)}")
    finally:
        for h in hooks:
            h.remove()
    draws = calibration.draws
    return Stats(
        tokens,
        {m: (v / tokens).float().numpy() for m, v in inputs.items()},
        {m: (v / draws).numpy() for m, v in fisher.items()},
    )


def with_measure(table: Table, kind: str) -> dict[str, dict[str, float]]:
    """Per module, per candidate, its cost under measure `kind` (refused if the table lacks it)."""
    if kind not in table.measures:
        raise WeightsmithError(
            f"--measure {kind}: the table holds {', '.join(table.measures)} (measure again with it)", code="usage"
        )
    return {m.module: m.cost.get(kind, {}) for m in table.modules}
