"""`quantize --method gptq` (and `weightsmith.quantize(..., method="gptq")`): the run around the engine's solver.

The engine (`engine.gptq`) streams the model and chooses each Linear's integer values; this module
is what a GPTQ quantize run does around it: check the destination before hours of work, tokenize
the calibration text, warn when the tokens are too few for the Hessians, keep the values in a scratch
folder beside OUT, then write the plan through the quantize pipeline with the method and the
calibration recorded in the manifest. The command line and the library both call `run`.

Across ranks (`engine.distributed`) every rank reads the checkpoint and the text and runs its part of
the engine's work; rank 0 alone touches OUT (the others' node may not see its folder), warns, writes,
and reports, and the others wait for it at a barrier so that none ends before the output exists.

Importing it does not import the engine, torch or transformers: they are imported when a run starts
(their import time is the "libraries" phase of `engine.gptq.PHASES`).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import Say
from weightsmith.core.timesplit import adding
from weightsmith.engine.distributed import World
from weightsmith.families import require_family
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.manifest import MethodRecord
from weightsmith.io.outputdir import check_destination, remove_stale, scratch
from weightsmith.io.provenance import Provenance, fingerprint
from weightsmith.quantization.pipeline import QuantizeResult, execute, kernel_dtype
from weightsmith.quantization.plan import QUANTIZE, Plan
from weightsmith.quantization.request import GptqOptions


def run(
    plan: Plan, opts: GptqOptions, *, layer: Say | None = None, warn: Say | None = None, world: World = World()
) -> QuantizeResult | None:
    """Tokens, a warning when they are too few for the Hessians, then the streamed GPTQ run of `plan`
    (made for a request whose method is "gptq", with these `opts`).

    `layer` gets a line per decoder layer; `warn` each warning (too few tokens; each module left to
    round-to-nearest, also recorded in the manifest's `method.rtn_fallback`). In a `world` of several
    ranks only rank 0 returns the result; the others return None once it is written."""
    assert plan.request is not None, "a plan made for a request"
    out = plan.request.output
    stale: list[str] = []
    if world.leader:
        # now, not after the hours the values take; what a killed run left goes first (a killed GPTQ run's
        # scratch folder frees its disk, a previous OUT it had set aside is back before OUT is judged)
        stale = remove_stale(out, keep=[plan.source.root])
        check_destination(plan.source.root, out, plan.request.request.force)
    else:
        layer = warn = None
    seconds: dict[str, float] = {}  # where the time goes before the engine's run: `gptq.PHASES`
    with adding(seconds, "libraries"):
        from weightsmith.calibration.measure import calibration_tokens
        from weightsmith.engine import gptq as _engine  # noqa: F401  (numba's kernels, timed as a library)
        from weightsmith.engine.loading import opened
        from weightsmith.fidelity.logits import ENGINE_LIBRARIES, missing_library

        missing = missing_library(ENGINE_LIBRARIES)
    if missing is not None:
        raise WeightsmithError(missing, code="engine.libraries")
    src = plan.source.root
    with adding(seconds, "tokens"):
        with opened(src, trust_remote_code=opts.trust_remote_code) as loader:  # a model it cannot run fails now
            activations = loader.source.activations
            vocab = loader.skeleton.model.get_input_embeddings().num_embeddings
        require_family(plan.source.config, "quantize --method gptq", src / CONFIG_FILE)
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        text = str(opts.text) if opts.text else None
        read = calibration_tokens(
            src, text, opts.builtin, opts.tokens, opts.seq_len, trust_remote_code=opts.trust_remote_code
        )
    sequences = read.sequences
    count = sum(map(len, sequences))
    largest = max(max(ids) for ids in sequences)
    if largest >= vocab:
        raise WeightsmithError(
            f"its tokenizer gives token id {largest:,} but the model embeds {vocab:,} tokens: "
            "not this model's tokenizer",
            file=src,
            code="engine.tokenizer",
        )
    widest = max((d.shape[1] for d in plan.decisions if d.action == "quantize"), default=0)
    if count < widest and warn is not None:
        warn(
            f"{count:,} calibration tokens, fewer than the widest quantized input "
            f"({widest:,} columns): its Hessian has rank at most {count:,} and is made invertible only by "
            f"the dampening ({opts.dampening} of its mean diagonal); pass more --tokens"
        )
    provenance = Provenance.of_run(
        fingerprint(plan.source), sequences, read.label, read.sha256, activations, text_chunks=read.chunks
    )
    result = quantize(plan, opts, sequences, provenance, layer=layer, world=world)
    if result is None:
        return None
    result.engine = {**seconds, **result.engine}
    result.notes[:0] = stale
    method = result.manifest.method
    for module, why in (method.rtn_fallback if method else {}).items():
        if warn is not None:
            warn(f"{module}: round-to-nearest, {why}")
    if method is not None and method.few_tokens and warn is not None:
        warn(_few_tokens_line(method.few_tokens))
    return result


def _few_tokens_line(few: dict[str, int]) -> str:
    """The run's word on expert modules whose Hessian had fewer rows than its width."""
    least = min(few.values())
    return (
        f"{len(few):,} MoE expert modules saw fewer calibration tokens than their input width "
        f"(the fewest: {least:,}): their Hessians are made invertible by the dampening, not the data; "
        "--all-experts gives every expert every token, or pass more --tokens"
    )


def _few_tokens(tokens: dict[str, int], plan: Plan) -> dict[str, int]:
    """The expert modules whose Hessian had fewer rows than their input width (those no token reached,
    also in `rtn_fallback`, included)."""
    widths = {d.module: d.shape[1] for d in plan.decisions if d.action == QUANTIZE and len(d.shape) == 2}
    return {m: n for m, n in sorted(tokens.items()) if n < widths.get(m, 0)}


def quantize(
    plan: Plan,
    opts: GptqOptions,
    token_ids: list[list[int]],
    provenance: Provenance,
    *,
    layer: Say | None = None,
    world: World = World(),
) -> QuantizeResult | None:
    """`plan` written to its request's output with GPTQ's values (`opts`) for every quantized Linear the
    engine runs.

    The values wait in a scratch folder beside the output (`outputdir.scratch`), removed however the run
    ends, and by the next run for it if this one is killed. Ranks other than 0 keep no values and
    return None when rank 0 has written the output.
    """
    assert plan.request is not None, "a plan made for a request"
    out, workers, request = plan.request.output, plan.request.workers, plan.request.request
    from weightsmith.engine import gptq as engine  # the module, not its `run`: tests stand in for it

    targets = {
        d.module: engine.Target(d.rule.scheme, kernel_dtype(plan, d))
        for d in plan.decisions
        if d.action == QUANTIZE and d.rule is not None
    }
    # rank 0 keeps the values; the others' node may not even see OUT's folder, so they keep none
    with scratch(out, "gptq") if world.leader else nullcontext(None) as work:
        found = engine.run(
            plan.source.root,
            token_ids,
            targets,
            work,
            dampening=opts.dampening,
            actorder=opts.actorder,
            trust_remote_code=opts.trust_remote_code,
            workers=workers,
            all_experts=opts.all_experts,
            world=world,
            progress=layer,
        )
        if not world.leader:
            world.barrier()  # rank 0 has written OUT
            return None
        method = MethodRecord(
            name="gptq",
            dampening=opts.dampening,
            block_size=engine.BLOCK_SIZE,
            actorder=opts.actorder,
            tokens=provenance.tokens,
            rtn_fallback=dict(sorted(found.rtn.items())),
            all_experts=opts.all_experts,
            few_tokens=_few_tokens(found.tokens, plan),
        )
        written = execute(
            plan,
            out,
            workers=workers,
            force=request.force,
            hash_sources=request.hash_sources,
            chosen=found.chosen,
            method=method,
            calibrated_from=provenance,
        )
        written.engine = found.seconds
    world.barrier()
    return written
