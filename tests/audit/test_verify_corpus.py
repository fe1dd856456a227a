"""A corpus of broken checkpoints, one per defect, each caught by `verify` with the right check id.

Every case starts from a clean tiny MoE checkpoint, breaks one thing, and states the exact set of
error ids verify must report (so a defect that also trips unrelated checks would fail the test),
or the warning id for defects runtimes tolerate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from doctor_builders import (
    Model,
    cli,
    halves,
    lfs_pointer,
    raw_shard,
    read_index,
    single,
    tiny_fp8,
    tiny_modelopt,
    tiny_moe,
    write,
    write_index,
    write_shard,
)

from weightsmith.audit.findings import INFO, Finding
from weightsmith.audit.verify import VerifyReport, verify


def problems(report: VerifyReport) -> list[Finding]:
    """Errors and warnings: the architecture family's note on what it did not check (info) left out."""
    return [f for f in report.findings if f.severity != INFO]


LAYER1 = "model-layer01.safetensors"
OUTER = "model-outer.safetensors"


@dataclass(frozen=True)
class Case:
    """One defect: how to make it, and what verify must say."""

    id: str
    make: Callable[[Path], Path]
    errors: frozenset[str] = frozenset()
    warnings: frozenset[str] = frozenset()
    scan: bool = False

    def __repr__(self) -> str:
        return self.id


def written(change: Callable[[Model], None] | None = None, fmt: str = "nvfp4") -> Callable[[Path], Path]:
    """A case maker: build the tiny model, change it in memory, write it."""

    def make(tmp: Path) -> Path:
        model = tiny_moe(fmt)
        if change is not None:
            change(model)
        return write(model, tmp / "ckpt")

    return make


def written_modelopt(change: Callable[[Model], None]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        model = tiny_modelopt()
        change(model)
        return write(model, tmp / "ckpt")

    return make


def written_fp8(style: str, change: Callable[[Model], None]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        model = tiny_fp8(style)
        change(model)
        return write(model, tmp / "ckpt")

    return make


def on_disk(change: Callable[[Path], None]) -> Callable[[Path], Path]:
    """A case maker: write the clean model, then change the files."""

    def make(tmp: Path) -> Path:
        root = write(tiny_moe(), tmp / "ckpt")
        change(root)
        return root

    return make


def rewrite_header(path: Path, change: Callable[[dict], None], data_delta: int = 0) -> None:
    """Re-serialise a shard's header after `change`, keeping its data (plus `data_delta` bytes)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + n])
    change(doc)
    data = raw[8 + n :]
    data = data + b"\0" * data_delta if data_delta >= 0 else data[:data_delta]
    text = json.dumps(doc).encode()
    raw_shard(path, text + b" " * (-len(text) % 8), data)


def first_entry(doc: dict) -> dict:
    return next(v for k, v in doc.items() if k != "__metadata__")


def _sorted_entries(doc: dict) -> list[dict]:
    return sorted((v for k, v in doc.items() if k != "__metadata__"), key=lambda e: e["data_offsets"][0])


def _gap(doc: dict) -> None:
    for entry in _sorted_entries(doc)[1:]:
        entry["data_offsets"] = [o + 4 for o in entry["data_offsets"]]


def _overlap(doc: dict) -> None:
    second = _sorted_entries(doc)[1]
    second["data_offsets"] = [o - 2 for o in second["data_offsets"]]


def _size_mismatch(doc: dict) -> None:
    entry = _sorted_entries(doc)[0]
    entry["shape"] = [entry["shape"][0] + 1, *entry["shape"][1:]]


def _duplicate_names(root: Path) -> None:
    shard = root / LAYER1
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    text = raw[8 : 8 + n].decode().rstrip()
    doc = json.loads(text)
    name, entry = next((k, v) for k, v in doc.items() if k != "__metadata__")
    text = text[:-1] + f',"{name}":{json.dumps(entry)}' + "}"  # same name, same entry, twice
    raw_shard(shard, text + " " * (-len(text) % 8), raw[8 + n :])


def _lone_surrogate_name(root: Path) -> None:
    """Rename a tensor to one ending in half a surrogate pair (json.dumps writes it as a \\ud800 escape)."""

    def change(doc: dict) -> None:
        name = next(k for k in doc if k != "__metadata__")
        doc[name + "\ud800"] = doc.pop(name)

    rewrite_header(root / LAYER1, change)


def _header_text(text: bytes) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        raw_shard(root / LAYER1, text, b"\0" * 8)

    return change


def _bytes(data: bytes) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / LAYER1).write_bytes(data)

    return change


def _truncate(root: Path) -> None:
    shard = root / LAYER1
    shard.write_bytes(shard.read_bytes()[:-2])


def _trailing(root: Path) -> None:
    with open(root / LAYER1, "ab") as f:
        f.write(b"\0\0\0\0")


def _index(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        doc = read_index(root)
        change(doc)
        write_index(root, doc)

    return apply


def _duplicate_tensor(root: Path) -> None:
    model = tiny_moe()
    write_shard(root / "model-extra.safetensors", {"model.norm.weight": model.tensors["model.norm.weight"]})
    doc = read_index(root)
    doc["weight_map"]["model.norm.weight"] = "model-extra.safetensors"
    write_index(root, doc)


def _drop(*names: str) -> Callable[[Model], None]:
    def change(model: Model) -> None:
        for name in names:
            del model.tensors[name]

    return change


def _set(name: str, value: np.ndarray) -> Callable[[Model], None]:
    def change(model: Model) -> None:
        model.tensors[name] = value

    return change


def _dense(module: str, shape: tuple[int, int]) -> Callable[[Model], None]:
    """Store a quantized module as a dense BF16 weight instead."""

    def change(model: Model) -> None:
        for name in [n for n in model.tensors if n.startswith(module + ".")]:
            del model.tensors[name]
        model.tensors[f"{module}.weight"] = np.full(shape, 0.01, ml_dtypes.bfloat16)

    return change


def _qc(change: Callable[[dict], None]) -> Callable[[Model], None]:
    def apply(model: Model) -> None:
        change(model.config["quantization_config"])

    return apply


def _rename_shared_expert(model: Model) -> None:
    model.tensors = {n.replace(".shared_expert.", ".shared_experts."): a for n, a in model.tensors.items()}


def _legacy_kv(model: Model) -> None:
    a = "model.layers.1.self_attn"
    model.tensors[f"{a}.kv_scale"] = model.tensors.pop(f"{a}.k_scale")
    del model.tensors[f"{a}.v_scale"]


def _no_quantization_config(model: Model) -> None:
    del model.config["quantization_config"]


E1 = "model.layers.1.mlp.experts.1"
ATT1 = "model.layers.1.self_attn"
BF16 = ml_dtypes.bfloat16

CASES = [
    # files
    Case("lfs-pointer/shard", on_disk(lambda r: (r / LAYER1).write_bytes(lfs_pointer())), frozenset({"lfs-pointer"})),
    Case(
        "lfs-pointer/index",
        on_disk(lambda r: (r / "model.safetensors.index.json").write_bytes(lfs_pointer(9000))),
        frozenset({"lfs-pointer"}),
    ),
    Case(
        "lfs-pointer/config",
        on_disk(lambda r: (r / "config.json").write_bytes(lfs_pointer(1200))),
        frozenset({"lfs-pointer"}),
    ),
    Case(
        "json.invalid/config",
        on_disk(lambda r: (r / "config.json").write_text('{"model_type": ')),
        frozenset({"json.invalid"}),
    ),
    Case("file.missing/config", on_disk(lambda r: (r / "config.json").unlink()), frozenset({"file.missing"})),
    # safetensors rules, on one shard
    Case("header.too-small", on_disk(_bytes(b"\x05\0\0\0")), frozenset({"header.too-small"})),
    Case(
        "header.too-large",
        on_disk(_bytes((200_000_000).to_bytes(8, "little") + b"{}")),
        frozenset({"header.too-large"}),
    ),
    Case(
        "header.truncated", on_disk(_bytes((5000).to_bytes(8, "little") + b'{"a": 1}')), frozenset({"header.truncated"})
    ),
    Case("header.not-utf8", on_disk(_header_text(b'{"\xff\xfe": 1}   ')), frozenset({"header.not-utf8"})),
    Case("header.not-json", on_disk(_header_text(b'{"a": [1, 2}    ')), frozenset({"header.not-json"})),
    Case("header.duplicate-name", on_disk(_duplicate_names), frozenset({"header.duplicate-name"})),
    Case(
        "header.metadata",
        on_disk(lambda r: rewrite_header(r / LAYER1, lambda d: d.update({"__metadata__": {"n": 1}}))),
        frozenset({"header.metadata"}),
    ),
    Case(
        "header.entry",
        on_disk(lambda r: rewrite_header(r / LAYER1, lambda d: first_entry(d).update(shape="abc"))),
        frozenset({"header.entry"}),
    ),
    Case(
        "header.not-json/nan",
        on_disk(lambda r: rewrite_header(r / LAYER1, lambda d: first_entry(d).update(amax=float("nan")))),
        frozenset({"header.not-json"}),
    ),
    Case("header.entry/lone-surrogate", on_disk(_lone_surrogate_name), frozenset({"header.entry"})),
    Case(
        "header.metadata/lone-surrogate",
        on_disk(lambda r: rewrite_header(r / LAYER1, lambda d: d.update({"__metadata__": {"format": "pt\udc00"}}))),
        frozenset({"header.metadata"}),
    ),
    Case(
        "header.dtype",
        on_disk(lambda r: rewrite_header(r / LAYER1, lambda d: first_entry(d).update(dtype="I4"))),
        frozenset({"header.dtype"}),
    ),
    Case(
        "header.misaligned",
        on_disk(_header_text(b'{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}'.ljust(64))),
        frozenset({"header.misaligned"}),
    ),
    Case(
        "header.size-mismatch",
        on_disk(lambda r: rewrite_header(r / LAYER1, _size_mismatch)),
        frozenset({"header.size-mismatch"}),
    ),
    Case("offsets.gap", on_disk(lambda r: rewrite_header(r / LAYER1, _gap, 4)), frozenset({"offsets.gap"})),
    Case(
        "offsets.overlap", on_disk(lambda r: rewrite_header(r / LAYER1, _overlap, -2)), frozenset({"offsets.overlap"})
    ),
    Case("size.truncated", on_disk(_truncate), frozenset({"size.truncated"})),
    Case("size.trailing", on_disk(_trailing), frozenset({"size.trailing"})),
    # the index, both ways
    Case(
        "index.missing-tensor",
        on_disk(_index(lambda d: d["weight_map"].update({"model.layers.1.mlp.gate.bias": LAYER1}))),
        frozenset({"index.missing-tensor"}),
    ),
    Case(
        "index.unlisted-tensor",
        on_disk(_index(lambda d: d["weight_map"].pop("model.norm.weight"))),
        frozenset({"index.unlisted-tensor"}),
    ),
    Case(
        "index.duplicate-tensor", on_disk(_duplicate_tensor), frozenset({"index.duplicate-tensor", "index.total-size"})
    ),
    Case(
        "index.wrong-shard",
        on_disk(_index(lambda d: d["weight_map"].update({"model.norm.weight": LAYER1}))),
        frozenset({"index.wrong-shard", "index.missing-tensor"}),
    ),
    Case(
        "index.total-size",
        on_disk(_index(lambda d: d["metadata"].update(total_size=12345))),
        frozenset({"index.total-size"}),
    ),
    Case(
        "index.total-size/not-an-integer",
        on_disk(_index(lambda d: d["metadata"].update(total_size="12345"))),
        frozenset({"index.total-size"}),
    ),
    Case(
        "index.missing-shard",
        on_disk(_index(lambda d: d["weight_map"].update({"model.extra.weight": "model-gone.safetensors"}))),
        frozenset({"index.missing-shard"}),
    ),
    Case("index.invalid", on_disk(_index(lambda d: d.update(weight_map=["a"]))), frozenset({"index.invalid"})),
    Case(
        "shard.stray",
        on_disk(lambda r: write_shard(r / "consolidated.safetensors", {"x": np.zeros(2, np.float32)})),
        warnings=frozenset({"shard.stray"}),
    ),
    # the quantization config against the tensors
    Case("quant.missing-param", written(_drop(f"{E1}.down_proj.weight_scale")), frozenset({"quant.missing-param"})),
    Case(
        "quant.param-dtype",
        written(_set(f"{E1}.up_proj.weight_scale", np.ones((32, 4), BF16))),
        frozenset({"quant.param-dtype"}),
    ),
    Case(
        "quant.param-shape",
        written(_set(f"{E1}.up_proj.weight_scale", np.ones((32, 8), ml_dtypes.float8_e4m3fn))),
        frozenset({"quant.param-shape"}),
    ),
    Case(
        "quant.param-shape/int4",
        written(_set(f"{E1}.up_proj.weight_shape", np.array([32, 128], np.int64)), fmt="int4"),
        frozenset({"quant.param-shape"}),
    ),
    Case(
        "quant.leftover-weight",
        written(_set(f"{E1}.gate_proj.weight", np.ones((32, 64), BF16))),
        frozenset({"quant.leftover-weight"}),
    ),
    Case(
        "quant.not-quantized",
        written(_dense("model.layers.2.mlp.shared_expert.down_proj", (64, 32))),
        frozenset({"quant.not-quantized"}),
    ),
    Case(
        "quant.ignored-but-quantized",
        written(_qc(lambda q: q["ignore"].append("re:.*shared_expert\\.down_proj$"))),
        frozenset({"quant.ignored-but-quantized"}),
    ),
    Case(
        "quant.not-targeted",
        written(
            _qc(
                lambda q: q["config_groups"]["group_0"].update(
                    targets=["re:.*mlp\\.experts\\..*", "re:.*layers\\.0\\.mlp\\..*"]
                )
            )
        ),
        frozenset({"quant.not-targeted"}),
    ),
    Case(
        "quant.fused-mismatch",
        written(_dense(f"{E1}.up_proj", (32, 64))),
        frozenset({"quant.fused-mismatch", "quant.not-quantized"}),
    ),
    Case(
        "quant.fused-global-scale",
        written(_set(f"{E1}.up_proj.weight_global_scale", np.array([3.0], np.float32))),
        warnings=frozenset({"quant.fused-global-scale"}),
    ),
    Case(
        "quant.unexpected-param",
        written(_set(f"{E1}.down_proj.weight_zero_point", np.zeros((8, 2), np.int32))),
        warnings=frozenset({"quant.unexpected-param"}),
    ),
    Case(
        "quant.config-invalid",
        written(_qc(lambda q: q["config_groups"]["group_0"]["weights"].update(bogus=1))),
        frozenset({"quant.config-invalid"}),
    ),
    Case(
        "quant.config-invalid/regex",
        written(_qc(lambda q: q["ignore"].append("re:model.(layers"))),
        frozenset({"quant.config-invalid"}),
    ),
    Case(
        "quant.undeclared",
        written(_no_quantization_config),
        frozenset({"quant.undeclared"}),
        frozenset({"kv.undeclared-scales"}),
    ),
    Case(
        "quant.lm-head-not-ignored",
        written(_qc(lambda q: q["ignore"].remove("lm_head"))),
        warnings=frozenset({"quant.lm-head-not-ignored"}),
    ),
    Case(
        "modelopt/quant.missing-param",
        written_modelopt(_drop("model.layers.1.mlp.up_proj.input_scale")),
        frozenset({"quant.missing-param"}),
    ),
    Case(
        "modelopt/quant.config-invalid",
        written_modelopt(lambda m: m.files["hf_quant_config.json"]["quantization"].pop("group_size")),
        frozenset({"quant.config-invalid"}),
    ),
    Case(
        "modelopt/quant.not-quantized",
        written_modelopt(
            lambda m: m.files["hf_quant_config.json"]["quantization"]["exclude_modules"].remove(
                "model.layers.*.self_attn*"
            )
        ),
        frozenset({"quant.not-quantized"}),
    ),
    Case(
        "fp8-ct/quant.param-shape",
        written_fp8("ct", _set("model.layers.1.mlp.up_proj.weight_scale", np.ones((192, 2), BF16))),
        frozenset({"quant.param-shape"}),
    ),
    Case(
        "fp8-hf/quant.param-shape",
        written_fp8("hf", _set("model.layers.1.mlp.down_proj.weight_scale_inv", np.ones((1, 1), np.float32))),
        frozenset({"quant.param-shape"}),
    ),
    Case(
        "fp8-hf/quant.missing-param",
        written_fp8("hf", _drop("model.layers.0.self_attn.o_proj.weight_scale_inv")),
        frozenset({"quant.missing-param"}),
    ),
    # KV-cache scales
    Case(
        "modelopt/kv.missing-scale",
        written_modelopt(_drop("model.layers.1.self_attn.v_proj.v_scale")),
        frozenset({"kv.missing-scale"}),
    ),
    Case("kv.missing-scale", written(_drop("model.layers.2.self_attn.k_scale")), frozenset({"kv.missing-scale"})),
    Case("kv.scale-dtype", written(_set(f"{ATT1}.k_scale", np.array(0.5, BF16))), frozenset({"kv.scale-dtype"})),
    Case(
        "kv.scale-shape",
        written(_set(f"{ATT1}.v_scale", np.array([0.5, 0.5], np.float32))),
        frozenset({"kv.scale-shape"}),
    ),
    Case(
        "kv.scale-value/zero",
        written(_set(f"{ATT1}.k_scale", np.array(0.0, np.float32))),
        frozenset({"kv.scale-value"}),
    ),
    Case(
        "kv.scale-value/nan",
        written(_set(f"{ATT1}.v_scale", np.array(math.nan, np.float32))),
        frozenset({"kv.scale-value"}),
    ),
    Case(
        "kv.scale-value/negative",
        written(_set(f"{ATT1}.k_scale", np.array(-0.5, np.float32))),
        frozenset({"kv.scale-value"}),
    ),
    Case(
        "kv.undeclared-scales",
        written(_qc(lambda q: q.update(kv_cache_scheme=None))),
        warnings=frozenset({"kv.undeclared-scales"}),
    ),
    Case("kv.deprecated-name", written(_legacy_kv), warnings=frozenset({"kv.deprecated-name"})),
    # names the runtime loads
    Case("names.runtime-mismatch", written(_rename_shared_expert), frozenset({"names.runtime-mismatch"})),
    # values
    Case(
        "values.non-finite",
        written(_set(f"{ATT1}.q_proj.weight", np.full((64, 64), np.nan, BF16))),
        frozenset({"values.non-finite"}),
        scan=True,
    ),
    Case(
        "values.all-zero",
        written(_set(f"{ATT1}.o_proj.weight", np.zeros((64, 64), BF16))),
        warnings=frozenset({"values.all-zero"}),
        scan=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_each_defect_is_caught_with_its_id(case: Case, tmp_path: Path) -> None:
    report = verify(case.make(tmp_path), scan=case.scan)
    errors = {f.check for f in report.findings if f.severity == "error"}
    warnings = {f.check for f in report.findings if f.severity == "warning"}
    assert errors == case.errors, [f.line() for f in report.findings]
    assert case.warnings <= warnings, [f.line() for f in report.findings]
    assert report.clean == (not case.errors)
    for f in report.findings:
        assert f.message and f.check and f.severity in ("error", "warning", "info")
        if f.check in case.errors | case.warnings and f.check not in ("quant.config-invalid",):
            assert f.file, f"{f.check} names no file"


def test_findings_name_file_and_tensor(tmp_path: Path) -> None:
    report = verify(written(_drop(f"{E1}.down_proj.weight_scale"))(tmp_path))
    (finding,) = problems(report)
    assert (finding.file, finding.tensor) == (LAYER1, f"{E1}.down_proj.weight_scale")
    assert "needs it for every quantized module" in finding.message


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("layout", [None, single, halves], ids=["by-layer", "single", "halves"])
def test_clean_checkpoints_pass(fmt: str, layout, tmp_path: Path) -> None:
    model = tiny_moe(fmt)
    if layout is not None:
        model.shard_of = layout
    root = write(model, tmp_path / "ckpt", index=layout is not single)
    report = verify(root, scan=True)
    assert report.clean and problems(report) == [], [f.line() for f in report.findings]
    assert all(c.errors == c.warnings == 0 for c in report.checks)


@pytest.mark.parametrize(
    "build", [tiny_modelopt, lambda: tiny_fp8("ct"), lambda: tiny_fp8("hf")], ids=["modelopt", "fp8-ct", "fp8-hf"]
)
def test_other_clean_formats_pass(build, tmp_path: Path) -> None:
    report = verify(write(build(), tmp_path / "ckpt"), scan=True)
    assert report.clean and problems(report) == [], [f.line() for f in report.findings]
    assert "Linear-like modules against" in next(c.scope for c in report.checks if c.id == "quantization")


def test_a_single_file_is_checked_as_a_shard(tmp_path: Path) -> None:
    root = write(tiny_moe(), tmp_path / "ckpt")
    assert verify(root / LAYER1).clean
    _trailing(root)
    (finding,) = verify(root / LAYER1).findings
    assert finding.check == "size.trailing" and finding.file == LAYER1


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_exit_status_clean_defect_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = write(tiny_moe(), tmp_path / "clean")
    code, out, _ = _run(["verify", str(clean)], capsys)
    assert code == 0 and "verify: clean" in out

    broken = written(_drop("model.layers.2.self_attn.k_scale"))(tmp_path / "b")
    code, out, _ = _run(["verify", str(broken)], capsys)
    assert code == 1 and "kv.missing-scale" in out and "model.layers.2.self_attn.k_scale" in out
    code, out, _ = _run(["verify", str(broken), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["clean"] is False
    assert (
        doc["findings"][0]["check"] == "kv.missing-scale" and doc["findings"][0]["file"] == "model-layer02.safetensors"
    )

    code, _, err = _run(["verify", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _run(["verify", str(tmp_path / "empty")], capsys)
    assert code == 2 and "is not a checkpoint" in err


def test_lfs_pointer_message_points_at_the_real_file(tmp_path: Path) -> None:
    report = verify(on_disk(lambda r: (r / LAYER1).write_bytes(lfs_pointer()))(tmp_path))
    (finding,) = problems(report)
    assert finding.file == LAYER1 and "git-LFS pointer" in finding.message and "resolve/" in finding.message
