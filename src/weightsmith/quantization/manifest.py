"""The manifest of one quantize run, built from its plan and the checkpoint it wrote.

The records and their reading live in `io.manifest` (anyone may read a manifest); building one needs
the plan, so it lives with the quantize flow.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

from weightsmith.core.version import __version__
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.io.manifest import (
    CalibrationRecord,
    CategorySizes,
    HubRecord,
    Manifest,
    MethodRecord,
    PrePassRecord,
    RecipeRecord,
    RuleRecord,
    Sizes,
    SourceFile,
    SourceRecord,
    TensorCounts,
    Tool,
)
from weightsmith.io.provenance import fingerprint
from weightsmith.quant import SINKHORN_ITERATIONS
from weightsmith.quantization.plan import Plan


def _by_category(ckpt: Checkpoint) -> dict[str, int]:
    sizes: dict[str, int] = defaultdict(int)
    for name, ref in ckpt.tensors.items():
        sizes[names.category(name)] += ref.info.nbytes
    return dict(sizes)


def _rules(plan: Plan) -> list[RuleRecord]:
    """Each recipe rule with the config group it was written as (rules that quantized nothing get none)."""
    group_names = iter(plan.quantization_config()["config_groups"])
    out = []
    for rule in plan.recipe.rules:
        count = sum(1 for d in plan.decisions if d.rule is rule and d.action == "quantize")
        out.append(
            RuleRecord(
                targets=list(rule.targets),
                scheme=rule.scheme.name,
                config_group=next(group_names) if count else None,
                weights=rule.scheme.weights_words(),
                quantized=count,
            )
        )
    return out


def build_manifest(
    plan: Plan,
    written: Checkpoint,
    source_hashes: dict[str, str],
    skipped: dict[str, str] | None = None,
    calibration: CalibrationRecord | None = None,
    method: MethodRecord | None = None,
    copied: list[str] | None = None,
) -> Manifest:
    """The manifest of one run: the plan, the checkpoint it wrote, the source files' hashes, and
    (for a calibrated scheme) where its statistics came from."""
    src = plan.source
    params = sum(math.prod(d.shape) for d in plan.decisions if d.action != "drop")
    before, after = src.tensor_bytes, written.tensor_bytes
    cat_before, cat_after = _by_category(src), _by_category(written)
    return Manifest(
        tool=Tool(name="weightsmith", version=__version__),
        created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        recipe=RecipeRecord(
            # the first rule's scheme: the only one unless `rules` holds several
            scheme=plan.scheme.name,
            config_group=plan.scheme.config_group_name,
            num_bits=plan.scheme.num_bits,
            group_size=plan.scheme.group_size,
            symmetric=plan.scheme.symmetric,
            scale_search=plan.scheme.scale_search,
            rules=_rules(plan),
            recipe_file=str(plan.recipe.file) if plan.recipe.file else None,
            preset=plan.preset,
            ignore=plan.ignore,
            source_format=plan.source_format.kind,
        ),
        source=SourceRecord(
            path=str(src.root),
            fingerprint=fingerprint(src),
            hub=None
            if plan.hub is None
            else HubRecord(repo_id=plan.hub.repo_id, revision=plan.hub.revision, commit=plan.hub.commit),
            files={
                shard: SourceFile(bytes=h.file_size, sha256=source_hashes.get(shard))
                for shard, h in src.headers.items()
            },
        ),
        tensors=TensorCounts(**{a: plan.count(a) for a in ("quantize", "keep", "decode", "drop")}),
        sizes=Sizes(
            bytes_before=before,
            bytes_after=after,
            gib_saved=round((before - after) / 2**30, 4),
            parameters=params,
            bits_per_parameter_before=round(before * 8 / params, 4) if params else None,
            bits_per_parameter_after=round(after * 8 / params, 4) if params else None,
            by_category={
                cat: CategorySizes(bytes_before=cat_before.get(cat, 0), bytes_after=cat_after.get(cat, 0))
                for cat in names.CATEGORIES
                if cat_before.get(cat) or cat_after.get(cat)
            },
        ),
        calibration=calibration,
        method=method,
        pre_pass=PrePassRecord(name=plan.pre_pass, iterations=SINKHORN_ITERATIONS, changed=list(plan.changed))
        if plan.pre_pass is not None
        else None,
        skipped_files=dict(skipped or {}),
        copied_files=list(copied or []),
    )
