"""The library entry points: `weightsmith.quantize(SRC, OUT, ...)` and `weightsmith.plan_quantize(SRC, ...)`.

Code and tests call this rather than the command-line module: it opens the checkpoint, plans
every tensor under one scheme or a recipe, and writes the output whole or not at all, returning
a `QuantizeResult` (the output folder, its typed `Manifest`, and notes on what was cleaned up first).
"""

from __future__ import annotations

import os
from pathlib import Path

from weightsmith.calibration import derived
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantize.pipeline import Progress, QuantizeResult, default_workers, execute
from weightsmith.quantize.plan import Plan, build_plan
from weightsmith.quantize.recipe import Recipe, load_recipe
from weightsmith.schemes import make_scheme


def plan_quantize(
    src: str | os.PathLike[str],
    scheme: str = "w4a16",
    *,
    recipe: str | os.PathLike[str] | Recipe | None = None,
    group_size: int | None = None,
    scale_search: str | None = None,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
) -> Plan:
    """What `quantize` would do to every tensor of `src`, and the predicted sizes; nothing is written.

    `recipe` (a TOML file or a `Recipe`) replaces `scheme`, `group_size` and `scale_search`.
    `scale_search` None takes the scheme's default (`wmse` for w4a16 and w4a16-asym); `"none"` is
    plain round-to-nearest, byte-identical to llm-compressor's `model_free_ptq`.
    `calibration` is a statistics file of `weightsmith calibrate` measured on `src`: calibrated
    schemes (nvfp4, fp8) and `kv_cache` ("fp8": KV-cache scales) need one.
    """
    if recipe is None:
        rules = Recipe.single(make_scheme(scheme, group_size, scale_search))
    else:
        rules = recipe if isinstance(recipe, Recipe) else load_recipe(Path(recipe))
    ckpt = Checkpoint.open(src)
    cal = derived.load(calibration, ckpt) if calibration is not None else None
    return build_plan(ckpt, rules, ignore, preset, cal, kv_cache)


def quantize(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    scheme: str = "w4a16",
    *,
    recipe: str | os.PathLike[str] | Recipe | None = None,
    group_size: int | None = None,
    scale_search: str | None = None,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
    workers: int | None = None,
    force: bool = False,
    hash_sources: bool = True,
    progress: Progress | None = None,
) -> QuantizeResult:
    """Quantize the checkpoint folder `src` into `out` (see `plan_quantize` for the scheme arguments).

    Raises a `WeightsmithError` (one line naming the file and tensor) for anything wrong with the
    input or the destination; `KeyboardInterrupt` leaves nothing behind.
    """
    the_plan = plan_quantize(
        src,
        scheme,
        recipe=recipe,
        group_size=group_size,
        scale_search=scale_search,
        ignore=ignore,
        preset=preset,
        calibration=calibration,
        kv_cache=kv_cache,
    )
    return execute(
        the_plan,
        Path(out),
        workers=workers or default_workers(),
        force=force,
        progress=progress,
        hash_sources=hash_sources,
    )
