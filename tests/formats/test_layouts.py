"""What the writer stores, what `verify` expects and what `eval` reads are one description per format.

For every registered scheme and a few weight shapes, the tensors `Scheme.outputs` plans are written
(filled with ones, `weight_shape` holding the shape) under the scheme's own `quantization_config`, and
`verify` must find nothing wrong with them; the layout `verify` derives from the written config must
equal the writer's tensors; `eval` must find every parameter it needs; and the format's decoder
must read them back to a weight of the logical shape. A copy with one tensor's shape off by one
must be caught, so the check is known to bite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from weightsmith import schemes
from weightsmith.audit.findings import ERROR, WARNING
from weightsmith.audit.verify import verify
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import compressors, layouts
from weightsmith.formats.declaration import quantized_modules, read_declaration
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

MODULE = "model.layers.0.mlp.down_proj"
#: Divisible by every scheme's group and block; one with partial 128-blocks; one with a row count
#: that is not a multiple of 8 (zero points of asymmetric int4 pack eight rows to a word).
SHAPES = [(256, 512), (200, 384), (36, 256)]
CASES = [(name, shape) for name in schemes.SCHEME_NAMES for shape in SHAPES]


def _array(spec: TensorSpec, shape: tuple[int, int]) -> np.ndarray:
    if spec.name.endswith(f".{names.WEIGHT_SHAPE}"):
        return np.array(shape, np.int64)
    dtype = DTYPES[spec.dtype].numpy
    assert dtype is not None
    return np.ones(spec.shape, dtype)  # a scale of one: decoding divides by a global scale


def _write(root: Path, scheme: schemes.Scheme, specs: list[TensorSpec], shape: tuple[int, int]) -> Path:
    root.mkdir()
    arrays = {s.name: _array(s, shape) for s in specs}
    with ShardWriter(root, "model.safetensors", specs, {"format": "pt"}) as writer:
        for name, array in arrays.items():
            writer.write(name, array)
    config = {"architectures": ["LlamaForCausalLM"], "quantization_config": scheme.quantization_config([])}
    (root / "config.json").write_text(json.dumps(config))
    return root


def _quant_findings(root: Path) -> list[str]:
    report = verify(root)
    return [f"{f.check} {f.tensor}: {f.message}" for f in report.findings if f.check.startswith("quant.")]


@pytest.mark.parametrize(("name", "shape"), CASES, ids=[f"{n}-{o}x{i}" for n, (o, i) in CASES])
def test_writer_verify_and_eval_agree(tmp_path: Path, name: str, shape: tuple[int, int]) -> None:
    scheme = schemes.make_scheme(name)
    if scheme.unsupported(shape):
        pytest.skip(f"{name} cannot take {shape}: {scheme.unsupported(shape)}")
    specs = scheme.outputs(MODULE, shape, "BF16")
    root = _write(tmp_path / "ok", scheme, specs, shape)
    assert _quant_findings(root) == []

    # the layout verify derives from the written config is the writer's, tensor for tensor
    decl = read_declaration(json.loads((root / "config.json").read_text()), None)
    assert decl is not None and len(decl.schemes) == 1
    layout = decl.layout(decl.schemes[0])
    assert layout is not None
    expected = layout.tensors(*shape)
    assert [s.name for s in specs] == [f"{MODULE}.{p}" for p in expected]
    for spec, tensor in zip(specs, expected.values(), strict=True):
        assert spec.shape == tensor.shape
        assert spec.dtype == tensor.dtype or (tensor.dtype is None and spec.dtype in decl.schemes[0].scale_dtypes)

    # eval finds what it needs (every tensor but a calibrated activation scale), and the decoder
    # reads it back to the logical shape
    (found,) = quantized_modules(Checkpoint.open(root))
    params = {p: _array(s, shape) for p, s in ((s.name.rsplit(".", 1)[1], s) for s in specs)}
    params.pop(layout.input_scale or "", None)
    assert set(found.params) == set(params)
    assert compressors.decompress(found.format or "", found.weights, params).shape == shape


@pytest.mark.parametrize(("name", "shape"), CASES, ids=[f"{n}-{o}x{i}" for n, (o, i) in CASES])
def test_encode_fills_exactly_the_layout(name: str, shape: tuple[int, int]) -> None:
    """Row blocks cut as the pipeline cuts them write every byte of every planned tensor once, and nothing else."""
    scheme = schemes.make_scheme(name)
    if scheme.unsupported(shape):
        pytest.skip(f"{name} cannot take {shape}: {scheme.unsupported(shape)}")
    w = np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)
    specs = {s.name.rsplit(".", 1)[1]: s for s in scheme.outputs("m", shape, "BF16")}
    specs.pop(scheme.layout.input_scale or "", None)  # a calibrated activation scale: the plan's value, not encode's
    tensor_param = None
    if scheme.first_pass is not None:
        state, bad = scheme.observe(w, 0, shape, None)
        assert bad == -1
        tensor_param = scheme.conclude({"m": state})["m"]
    written = {p: np.zeros(s.nbytes, np.int32) for p, s in specs.items()}
    step = math.lcm(8, scheme.ROW_MULTIPLE)
    for r0 in range(0, shape[0], step):
        writes, bad = scheme.encode(w[r0 : r0 + step], r0, shape, tensor_param)
        assert bad == -1
        for param, data, offset in writes:
            n = np.ascontiguousarray(data).nbytes
            assert param in specs and offset + n <= specs[param].nbytes, (param, offset, n)
            written[param][offset : offset + n] += 1
    assert {p: bool((c == 1).all()) for p, c in written.items()} == dict.fromkeys(specs, True)


@pytest.mark.parametrize("name", schemes.SCHEME_NAMES)
def test_a_wrong_shape_is_caught(tmp_path: Path, name: str) -> None:
    """Each tensor but the codes, one column too many: verify names it (the agreement above can fail)."""
    scheme = schemes.make_scheme(name)
    shape = SHAPES[0]
    specs = scheme.outputs(MODULE, shape, "BF16")
    for i, spec in enumerate(specs[1:], 1):
        wrong = TensorSpec(spec.name, spec.dtype, (*spec.shape[:-1], spec.shape[-1] + 1))
        root = _write(tmp_path / str(i), scheme, [*specs[:i], wrong, *specs[i + 1 :]], shape)
        found = _quant_findings(root)
        assert found and all(f.startswith(f"quant.param-shape {spec.name}") for f in found), (spec, found)


def test_static_activations_add_their_scale() -> None:
    """Calibrated schemes slot in: static activations add `input_scale`, NVFP4's `input_global_scale`."""
    fp8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
    static = dict(fp8, dynamic=False)
    layout = compressors.of_group(ct.FLOAT_QUANTIZED, dict(fp8, strategy="channel"), static)
    assert layout is not None
    assert layout.dtypes() == {names.WEIGHT: "F8_E4M3", names.WEIGHT_SCALE: None, names.INPUT_SCALE: None}
    assert layout.tensors(4, 8)[names.INPUT_SCALE].scalar
    assert names.INPUT_SCALE not in layout.dtypes(inputs=False)
    assert compressors.of_group(ct.FLOAT_QUANTIZED, fp8, dict(fp8, dynamic=True)).dtypes() == {  # type: ignore[union-attr]
        names.WEIGHT: "F8_E4M3",
        names.WEIGHT_SCALE: None,
    }
    nvfp4 = schemes.make_scheme("nvfp4a16").weight_args()
    local = dict(nvfp4, dynamic="local")
    layout = compressors.of_group(ct.NVFP4_PACK_QUANTIZED, nvfp4, local)
    assert layout is not None
    assert layout.tensors(4, 32)[names.INPUT_GLOBAL_SCALE] == layouts.Tensor("F32", (1,), scalar=True)


def test_verify_expects_a_static_activation_scale(tmp_path: Path) -> None:
    """A group with static activations whose modules lack `input_scale` is reported, naming it."""
    scheme = schemes.make_scheme("fp8-dynamic")
    shape = SHAPES[0]
    root = _write(tmp_path / "ckpt", scheme, scheme.outputs(MODULE, shape, "BF16"), shape)
    config = json.loads((root / "config.json").read_text())
    group = next(iter(config["quantization_config"]["config_groups"].values()))
    group["input_activations"].update(dynamic=False, strategy="tensor")
    (root / "config.json").write_text(json.dumps(config))
    report = verify(root)
    missing = [f for f in report.findings if f.check == "quant.missing-param"]
    assert [(f.severity, f.tensor) for f in missing] == [(ERROR, f"{MODULE}.{names.INPUT_SCALE}")]
    assert not [f for f in report.findings if f.check.startswith("quant.") and f.severity == WARNING]
