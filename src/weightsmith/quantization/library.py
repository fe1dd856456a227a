"""`weightsmith.quantize(request)` and `weightsmith.plan_quantize(request)`: the quantize flow as a library call.

The command (`quantization.cli`) and these functions build the same `QuantizeRequest`, check it with the
same function (`request.resolve`), and run the same steps: `plan` (the checkpoint opened, every tensor's
decision, the pre-pass checked), then `write` (the data-free pipeline, or the GPTQ run). Nothing here
prints: warnings go to `Hooks.warn`, else to Python's `warnings`; progress to the other hooks, when given.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import Say, warner
from weightsmith.engine.distributed import World
from weightsmith.quantization.pipeline import CompileNotice, Progress, QuantizeResult, execute
from weightsmith.quantization.plan import Plan
from weightsmith.quantization.request import QuantizeRequest, open_plan, plan_warnings, resolve


@dataclass(frozen=True)
class Hooks:
    """Where a run reports while it works; each None says nothing.

    `progress` gets the input bytes done (the data-free write), `layer` a line per decoder layer (GPTQ),
    `warn` each warning the command would print (None: Python's `warnings`), `compiling` the notice
    before a kernel compiles (the data-free write). `downloads`: show a Hub download's progress bars."""

    progress: Progress | None = None
    layer: Say | None = None
    warn: Say | None = None
    compiling: CompileNotice | None = None
    downloads: bool = False


def plan(request: QuantizeRequest, hooks: Hooks = Hooks()) -> Plan:
    """What `quantize` would do to every tensor of `request.source`, and the predicted sizes; nothing is
    written (`request.output` may be None).

    This is `quantize --dry-run`: it refuses what that refuses, so a plan that passes here is one
    `write` will carry out. `hooks.warn` is told of recipe targets that match nothing beside others
    that do (a recipe none of whose targets matches a Linear-like weight is refused) and of a
    statistics file measured on too few tokens."""
    made = open_plan(resolve(request, say=hooks.layer), progress=hooks.downloads)
    say = warner(hooks.warn)
    for message in plan_warnings(made):
        say(message)
    return made


def quantize(request: QuantizeRequest, hooks: Hooks = Hooks()) -> QuantizeResult:
    """Quantize `request.source` into `request.output`: `weightsmith quantize`, byte for byte.

    Raises a `WeightsmithError` (one line naming the file and tensor) for anything wrong with the
    request, the input or the destination; `KeyboardInterrupt` leaves nothing behind."""
    if request.output is None:
        raise WeightsmithError("quantize needs an output folder (plan_quantize makes a plan alone)", code="usage")
    result = write(plan(request, hooks), hooks)
    assert result is not None, "one process is its own rank 0"
    return result


def write(plan: Plan, hooks: Hooks = Hooks(), world: World = World()) -> QuantizeResult | None:
    """The plan written to its request's output: by the GPTQ run when the method is "gptq", else by the
    data-free pipeline. The one place the command and the library call decide it. In a `world` of several
    ranks only GPTQ runs (it has work to share), and only rank 0 returns a result."""
    resolved = plan.request
    if resolved is None:
        raise TypeError("write takes a plan made by `plan` (it carries the request it carries out)")
    if resolved.gptq is not None:
        from weightsmith.quantization.gptq import run

        return run(plan, resolved.gptq, layer=hooks.layer, warn=warner(hooks.warn), world=world)
    if world.size > 1:
        raise WeightsmithError(
            f"{world.size} ranks, but only --method gptq runs across ranks (round-to-nearest has no calibration "
            "run to share): run it as one process",
            code="usage",
        )
    return execute(
        plan,
        resolved.output,
        workers=resolved.workers,
        force=resolved.request.force,
        progress=hooks.progress,
        hash_sources=resolved.request.hash_sources,
        on_compile=hooks.compiling,
    )
