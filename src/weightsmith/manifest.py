"""The manifest written into every output: the recipe, the provenance and the byte accounting.

It is what a later `card` or audit reads to say how a checkpoint was made without guessing:
scheme and ignore list, tool version, source file hashes, and bytes and bits per parameter by
category before and after.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith import __version__, names
from weightsmith.checkpoint import Checkpoint
from weightsmith.files import open_regular, write_json_new

if TYPE_CHECKING:
    from weightsmith.plan import Plan

MANIFEST_FILE = "weightsmith.json"
MANIFEST_VERSION = 2  # 2: recipe.rules and recipe.recipe_file


def hash_files(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file, streamed (hashlib releases the GIL while it digests)."""
    out = {}
    for p in paths:
        with os.fdopen(open_regular(p), "rb") as f:
            out[p.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def _by_category(ckpt: Checkpoint) -> dict[str, int]:
    sizes: dict[str, int] = defaultdict(int)
    for name, ref in ckpt.tensors.items():
        sizes[names.category(name)] += ref.info.nbytes
    return dict(sizes)


def _rules(plan: Plan) -> list[dict]:
    """Each recipe rule: what it targets, its scheme in words, and how many weights it quantized."""
    config_groups = plan.quantization_config()["config_groups"]
    group_names = list(config_groups)
    out, g = [], 0
    for rule in plan.recipe.rules:
        count = sum(1 for d in plan.decisions if d.rule is rule and d.action == "quantize")
        group = None
        if count:
            group, g = group_names[g], g + 1
        out.append(
            {
                "targets": list(rule.targets),
                "scheme": rule.scheme.name,
                "config_group": group,
                "weights": rule.scheme.weights_words(),
                "quantized": count,
            }
        )
    return out


def build_manifest(plan: Plan, written: Checkpoint, source_hashes: dict[str, str]) -> dict:
    """The manifest of one run (plain JSON types)."""
    src = plan.source
    params = sum(math.prod(d.shape) for d in plan.decisions if d.action != "drop")
    before, after = src.tensor_bytes, written.tensor_bytes
    cat_before, cat_after = _by_category(src), _by_category(written)
    return {
        "manifest_version": MANIFEST_VERSION,
        "tool": {"name": "weightsmith", "version": __version__},
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": {
            # the first rule's scheme: the only one unless `rules` holds several
            "scheme": plan.scheme.name,
            "config_group": plan.scheme.config_group_name,
            "num_bits": plan.scheme.num_bits,
            "group_size": plan.scheme.group_size,
            "symmetric": plan.scheme.symmetric,
            "scale_search": plan.scheme.scale_search,
            "rules": _rules(plan),
            "recipe_file": str(plan.recipe.file) if plan.recipe.file else None,
            "preset": plan.preset,
            "ignore": plan.ignore,
            "source_format": plan.source_format.kind,
        },
        "source": {
            "path": str(src.root),
            "files": {
                shard: {"bytes": h.file_size, "sha256": source_hashes.get(shard)} for shard, h in src.headers.items()
            },
        },
        "tensors": {a: plan.count(a) for a in ("quantize", "keep", "decode", "drop")},
        "sizes": {
            "bytes_before": before,
            "bytes_after": after,
            "gib_saved": round((before - after) / 2**30, 4),
            "parameters": params,
            "bits_per_parameter_before": round(before * 8 / params, 4) if params else None,
            "bits_per_parameter_after": round(after * 8 / params, 4) if params else None,
            "by_category": {
                cat: {"bytes_before": cat_before.get(cat, 0), "bytes_after": cat_after.get(cat, 0)}
                for cat in names.CATEGORIES
                if cat_before.get(cat) or cat_after.get(cat)
            },
        },
    }


def write_manifest(folder: Path, manifest: dict) -> None:
    write_json_new(folder, MANIFEST_FILE, manifest)
