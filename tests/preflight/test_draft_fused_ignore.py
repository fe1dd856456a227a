"""`draft.fused-ignore`: a draft whose q/k/v are kept BF16 by `ignore` entries that name only the shards.

vLLM builds a draft's layers with `get_draft_quant_config` (`models/utils.py`), a quant config made by
`VllmConfig.get_quantization_config` and never handed the model's `packed_modules_mapping`; so
compressed-tensors tests the fused layer's own name (`...qkv_proj`) against `ignore`, builds it
quantized, and the draft's BF16 q/k/v have no parameter to load into (vLLM CPU's own refusal is in
tests/vllm_truth/test_vllm_drafts.py). Read here from the 0.25.1 and 0.33.0 wheels.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import weightsmith as ws
from models import smollm2_fp32
from tiny_drafts import llama_eagle3, target
from vllm_wheels import vllm_wheel
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.report import LOAD

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle3")
    tgt = target(root / "target", "llama", smollm2_fp32())
    bf16 = llama_eagle3(root / "draft", tgt)
    made = {"target": tgt}
    for name, ignore in (("shards", r"re:.*\.(q|k|v)_proj$"), ("fused", r"re:.*\.(q|k|v|qkv)_proj$")):
        made[name] = root / name
        ws.quantize(ws.QuantizeRequest(source=bf16, output=made[name], preset="eagle3-draft", ignore=[ignore]))
    return made


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0"])
def test_shards_kept_by_their_own_names_will_not_load(drafts: dict[str, Path], version: str) -> None:
    found = preflight(drafts["target"], vllm_wheel(version), draft=drafts["shards"], method="eagle3")
    (item,) = [i for i in found.items if i.check == "draft.fused-ignore"]
    assert item.impact == LOAD and item.tensor == "midlayer.self_attn.k_proj", item
    assert "q_proj" in item.message and "qkv_proj quantized" in item.message
    call, made = item.evidence
    assert call.show().startswith("llama_eagle3.py:") and "get_draft_quant_config(" in call.text
    assert made.show().startswith("utils.py:") and "get_quantization_config" in made.text
    assert "qkv" in item.fix


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0"])
def test_an_entry_naming_the_fused_layer_too_loads(drafts: dict[str, Path], version: str) -> None:
    found = preflight(drafts["target"], vllm_wheel(version), draft=drafts["fused"], method="eagle3")
    assert not [i for i in found.items if i.check == "draft.fused-ignore"]


def test_a_vllm_that_hands_the_draft_its_mapping_is_not_blamed(drafts: dict[str, Path], tmp_path: Path) -> None:
    """0.33.0's files with get_draft_quant_config setting a packed_modules_mapping: nothing to report."""
    import zipfile

    with zipfile.ZipFile(vllm_wheel("0.33.0")) as wheel:
        wheel.extractall(tmp_path, [n for n in wheel.namelist() if n.endswith((".py", ".dist-info/METADATA"))])
    utils = tmp_path / "vllm/model_executor/models/utils.py"
    made = "        VllmConfig.get_quantization_config(draft_model_config, draft_load_config)\n"
    text = utils.read_text()
    assert text.count(made) == 1
    handed = made.replace("draft_load_config)", "draft_load_config, packed_modules_mapping)")
    utils.write_text(text.replace(made, handed))
    found = preflight(drafts["target"], tmp_path, draft=drafts["shards"], method="eagle3")
    assert not [i for i in found.items if i.check == "draft.fused-ignore"]
