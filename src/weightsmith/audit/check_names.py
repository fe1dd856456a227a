"""Tensor names against the names the runtime loads for the checkpoint's architecture."""

from __future__ import annotations

from typing import Any

from weightsmith.audit.findings import ERROR, Finding
from weightsmith.audit.modules import Located
from weightsmith.io.names import RUNTIME_NAME_RULES, model_type


def check_runtime_names(config: dict[str, Any] | None, tensors: dict[str, Located]) -> tuple[list[Finding], str]:
    arch = model_type(config)
    if arch is None:
        return [], "no model_type or architectures in config.json, no rules apply"
    rules = [r for r in RUNTIME_NAME_RULES if arch in r.model_types]
    if not rules:
        return [], f"no naming rules for model_type {arch}"
    found = []
    for name, located in tensors.items():
        for rule in rules:
            if rule.found.search(name):
                found.append(
                    Finding(
                        "names.runtime-mismatch",
                        ERROR,
                        f"should be named '{rule.rename(name)}': {rule.consequence}",
                        located.shard,
                        name,
                    )
                )
    return found, f"model_type {arch}: {len(rules)} naming rule(s) over {len(tensors):,} tensors"
