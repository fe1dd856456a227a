"""Property tests of the config's quantization block: any JSON there gives an answer or one line.

Starting from real declarations (compressed-tensors FP8 per channel, HF block FP8, our own W4A16
output), one node anywhere in `quantization_config` (or the block itself) is replaced by arbitrary
JSON. `verify` must return a report, and `quantize`'s planning must return a plan or raise a
`WeightsmithError`: never another exception, never a hang (each example has a deadline).
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path

import pytest
from doctor_builders import tiny_fp8, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightsmith.audit.verify import verify
from weightsmith.core.errors import WeightsmithError
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization.plan import build_plan
from weightsmith.schemes import make_scheme

FUZZ = settings(
    max_examples=400,
    deadline=timedelta(seconds=3),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.sampled_from(["", "fp8", "float", "int", "Linear", "re:.*", "re:([", "group", "block", "channel", "tensor"])
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _ours() -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 128,
                    "dynamic": False,
                },
                "input_activations": None,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
    }


BASES = {
    "ct": tiny_fp8("ct", layers=1, hidden=64, intermediate=128),
    "hf": tiny_fp8("hf", layers=1, hidden=64, intermediate=128),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {style: write(model, tmp_path_factory.mktemp(style), index=False) for style, model in BASES.items()}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, object]:
    """A style and a quantization_config with one node replaced by arbitrary JSON."""
    style = draw(st.sampled_from(["ct", "hf", "ours"]))
    doc = copy.deepcopy(_ours() if style == "ours" else BASES[style].config["quantization_config"])
    if draw(st.integers(0, 9)) == 0:
        return style, draw(JSON)
    node: object = doc
    while isinstance(node, dict | list) and node:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()) or not isinstance(node[key], dict | list) or not node[key]:
            node[key] = draw(JSON)
            break
        node = node[key]
    return style, doc


@FUZZ
@given(mutated())
def test_any_quantization_block_gives_an_answer_or_one_line(folders: dict[str, Path], case: tuple[str, object]) -> None:
    style, qc = case
    folder = folders["ct" if style == "ours" else style]
    config = {**BASES["ct" if style == "ours" else style].config, "quantization_config": qc}
    (folder / "config.json").write_text(json.dumps(config))
    report = verify(folder)
    assert report.errors == sum(1 for f in report.findings if f.severity == "error")
    try:
        build_plan(Checkpoint.open(folder), make_scheme("w4a16"), [], None)
    except WeightsmithError as exc:
        assert "\n" not in str(exc) and exc.file
