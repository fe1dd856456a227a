"""The `weights` keys the doctor accepts in a compressed-tensors config group are the ones we write."""

from __future__ import annotations

import pytest

from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import read_declaration

#: `QuantizationArgs` fields in compressed-tensors 0.17-0.20, written out.
QUANTIZATION_ARGS = {
    "num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
    "actorder", "scale_dtype", "zp_dtype", "observer", "observer_kwargs",
}  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ct.weight_args(4, True, 128),
        ct.weight_args(4, False, 32),
        ct.weight_args(4, True, 16, type_="float", strategy="tensor_group", scale_dtype="torch.float8_e4m3fn"),
        ct.weight_args(8, True, 0, type_="float", strategy="channel"),
    ],
)
def test_accepted_fields_are_exactly_the_keys_weight_args_writes(args: dict) -> None:
    assert set(args) == ct.QUANT_ARGS_FIELDS == QUANTIZATION_ARGS


def test_accepted_fields_are_compressed_tensors_quantization_args() -> None:
    quantization = pytest.importorskip("compressed_tensors.quantization")
    fields = quantization.QuantizationArgs.model_fields
    assert quantization.QuantizationArgs.model_config.get("extra") == "forbid"
    assert set(fields) == ct.QUANT_ARGS_FIELDS


def _config(weights: dict) -> dict:
    qc = ct.quantization_config("group_0", ct.PACK_QUANTIZED, weights, ["lm_head"])
    return {"model_type": "llama", "quantization_config": qc}


def test_what_we_write_declares_without_problems() -> None:
    decl = read_declaration(_config(ct.weight_args(4, True, 128)), None)
    assert decl is not None and decl.problems == []


def test_an_unknown_weights_key_is_refused() -> None:
    decl = read_declaration(_config({**ct.weight_args(4, True, 128), "bogus": 1}), None)
    assert decl is not None and len(decl.problems) == 1 and decl.problems[0].file == "config.json"
    assert "['bogus']" in decl.problems[0].message
