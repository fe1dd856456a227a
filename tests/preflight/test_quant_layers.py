"""`preflight.quant_layers`: verify's quantization mismatches, sorted by what vLLM does with them.

What vLLM really does is tests/vllm_truth/test_vllm_predictions.py's; here, each mismatch on the
small synthetic FP8 checkpoint gets its impact, and a matching checkpoint gets nothing.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from audit.doctor_builders import tiny_fp8, write
from weightsmith.preflight.quant_layers import check_quant_layers
from weightsmith.preflight.report import LOAD, WRONG, open_side

DOWN = "model.layers.1.mlp.down_proj"


def items(tmp_path: Path, edit=None) -> list[tuple[str, str, str | None]]:
    model = tiny_fp8()
    if edit is not None:
        edit(model)
    root = write(model, tmp_path / "ckpt")
    return [(i.check, i.impact, i.tensor) for i in check_quant_layers(open_side(root, "target"))]


def test_a_checkpoint_its_config_describes_has_none(tmp_path: Path) -> None:
    assert items(tmp_path) == []


def test_quantized_but_not_targeted_will_not_load(tmp_path: Path) -> None:
    def untarget(model) -> None:
        model.qc["config_groups"]["group_0"]["targets"] = [r"re:.*self_attn\..*", r"re:.*mlp\.(gate|up)_proj$"]

    found = items(tmp_path, untarget)
    assert found == [("quant.not-targeted", LOAD, "model.layers.0.mlp.down_proj.weight")]


def test_quantized_but_ignored_will_not_load(tmp_path: Path) -> None:
    found = items(tmp_path, lambda model: model.qc["ignore"].append(DOWN))
    assert found == [("quant.ignored-but-quantized", LOAD, f"{DOWN}.weight")]


def test_dense_but_targeted_serves_wrong_numbers(tmp_path: Path) -> None:
    def densify(model) -> None:
        del model.tensors[f"{DOWN}.weight_scale"]
        model.tensors[f"{DOWN}.weight"] = np.ones((64, 192), ml_dtypes.bfloat16)

    found = items(tmp_path, densify)
    assert found == [("quant.not-quantized", WRONG, f"{DOWN}.weight")]


def test_the_message_counts_the_modules_and_names_the_first(tmp_path: Path) -> None:
    model = tiny_fp8()
    model.qc["ignore"] += [r"re:.*down_proj$"]
    root = write(model, tmp_path / "ckpt")
    [item] = check_quant_layers(open_side(root, "target"))
    assert item.message.startswith("2 module(s) stored otherwise than the quantization config says; ")
    assert "There is no module or parameter named '...weight_scale'" in item.message
    assert item.message.endswith("the runtime expects a dense weight")
    assert item.file == "target/model-layer00.safetensors"
