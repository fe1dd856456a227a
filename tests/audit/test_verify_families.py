"""Verify's families: each carries its check, and what is skipped follows from what it needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor_builders import tiny_fp8, tiny_moe, write

from weightsmith.audit import verify as v
from weightsmith.audit.findings import INFO, WARNING, Finding

LAYER1 = "model-layer01.safetensors"


def test_structural_families_are_those_that_need_nothing() -> None:
    # transplant refuses its output on these families' errors
    assert [f.id for f in v.FAMILIES if f.structural] == ["files", "safetensors", "index"]
    assert {"quantization", "kv-cache", "names"} <= {f.id for f in v.FAMILIES if v.CONFIG in f.needs}
    assert "values" in {f.id for f in v.FAMILIES if v.SCAN in f.needs}
    ids = [f.id for f in v.FAMILIES]
    assert len(set(ids)) == len(ids)


def test_the_skips_and_their_reasons_follow_from_the_needs(tmp_path: Path) -> None:
    needing_config = [f.id for f in v.FAMILIES if v.CONFIG in f.needs]
    root = write(tiny_moe(), tmp_path / "ckpt")
    scopes = {c.id: c.scope for c in v.verify(root / LAYER1).checks}
    config_reason = v.NOT_RUN + "a single file has no config to compare with"
    assert [k for k, s in scopes.items() if s == config_reason] == needing_config
    assert scopes["values"] == v.NOT_RUN + "add --scan-values to read every value"
    (root / "config.json").unlink()
    scopes = {c.id: c.scope for c in v.verify(root).checks}
    assert [k for k, s in scopes.items() if s == v.NOT_RUN + "no readable config.json"] == needing_config
    assert {k for k, s in scopes.items() if not s.startswith(v.NOT_RUN)} == {"files", "safetensors", "index"}


def test_a_new_family_is_one_entry_and_its_check_reads_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[v.CheckContext] = []

    def first_scale(ctx: v.CheckContext) -> tuple[list[Finding], str]:
        seen.append(ctx)
        scales = [name for name in ctx.survey.tensors if name.endswith("weight_scale")]
        return [Finding("dummy.scale", WARNING, "a scale", "f", scales[0])], f"{len(ctx.modules)} modules"

    family = v.Family("dummy", "a family added by a test", ("dummy.",), first_scale, frozenset({v.CONFIG}))
    monkeypatch.setattr(v, "FAMILIES", (*v.FAMILIES, family))
    root = write(tiny_fp8("ct"), tmp_path / "ckpt")
    report = v.verify(root)
    check = next(c for c in report.checks if c.id == "dummy")
    assert check.ran and check.warnings == 1 and check.scope.endswith(" modules")
    assert [f.check for f in report.findings if f.severity != INFO] == ["dummy.scale"]
    assert seen[0].declaration is not None and seen[0].declaration is seen[0].declaration
    skipped = next(c for c in v.verify(next(root.glob("*.safetensors"))).checks if c.id == "dummy")
    assert not skipped.ran
