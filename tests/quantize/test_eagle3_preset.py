"""`--preset eagle3-draft`: an EAGLE3 draft quantized so that vLLM loads it.

Facts from vLLM `vllm/model_executor/models/llama_eagle3.py` (commit 00bd1493b3e8; the 0.25.1
and 0.33.0 wheels): `embed_tokens` is built without the draft's quant_config; `fc` (a
ReplicatedLinear), the midlayer's attention and MLP, and `lm_head` with it (a ParallelLMHead,
which a `Linear` target never claims, so the plain lm_head `quantize` keeps is what vLLM builds).
`load_weights` renames `midlayer.` to `layers.0.` and prepends `model.`, and the layer is built at
prefix `model.layers.{i + the target's layer count}`, so the names vLLM matches against `ignore`
are not the names on disk. The draft below is named as real EAGLE3 drafts are on disk:
`midlayer.*`, top-level `fc`, `norm`, `lm_head`, and `d2t` (int64) and `t2d` (bool) vocabulary
maps (vLLM speculators `research/eagle3/convert_checkpoint.py`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from clirun import run
from synth import write_checkpoint
from weightsmith.audit.verify import verify
from weightsmith.formats.targets import Targets
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization.plan import KEEP, QUANTIZE, build_plan
from weightsmith.quantization.presets import PRESETS
from weightsmith.schemes import make_scheme

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB, DRAFT_VOCAB = 128, 4, 2, 32, 256, 96, 64
#: The target's layer count: vLLM builds the draft's layer 0 as `model.layers.{TARGET_LAYERS}`.
TARGET_LAYERS = 32

EAGLE3_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "vocab_size": VOCAB,
    "draft_vocab_size": DRAFT_VOCAB,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def eagle3_tensors(layers: tuple[str, ...] = ("midlayer",)) -> dict[str, np.ndarray]:
    """An EAGLE3 draft's state dict as it is on disk (one `midlayer`, or `layers.N` in the speculators format)."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, ml_dtypes.bfloat16)

    t = {
        "embed_tokens.weight": w(VOCAB, HIDDEN),
        "fc.weight": w(HIDDEN, 3 * HIDDEN),  # the target's three auxiliary hidden states, fused
        "norm.weight": ones(HIDDEN),
        "lm_head.weight": w(DRAFT_VOCAB, HIDDEN),
        "d2t": np.arange(DRAFT_VOCAB, dtype=np.int64),
        "t2d": np.arange(VOCAB) % 3 == 0,
    }
    for i, p in enumerate(layers):
        qkv_in = 2 * HIDDEN if i == 0 else HIDDEN  # layer 0 reads the embeddings and the hidden states
        t |= {
            f"{p}.hidden_norm.weight": ones(HIDDEN),
            f"{p}.input_layernorm.weight": ones(HIDDEN),
            f"{p}.post_attention_layernorm.weight": ones(HIDDEN),
            f"{p}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, qkv_in),
            f"{p}.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, qkv_in),
            f"{p}.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, qkv_in),
            f"{p}.self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
            f"{p}.mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN),
            f"{p}.mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
            f"{p}.mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
        }
    return t


# --- vLLM's side, simulated: the Linear layers it builds and how compressed-tensors matches `ignore` ---


def vllm_layer(module: str) -> str:
    """The prefix vLLM builds a draft Linear under: `midlayer.x` / `layers.i.x` -> `model.layers.{i+N}.x`."""
    module = module.replace("midlayer.", "layers.0.", 1)
    module = re.sub(r"^layers\.(\d+)\.", lambda m: f"layers.{int(m[1]) + TARGET_LAYERS}.", module)
    fused = names.fused_partners(module)
    return "model." + (fused[0] if fused is not None else module)


def vllm_ignores(layer: str, ignore: list[str]) -> bool:
    """compressed-tensors' `should_ignore_layer`: a fused layer by its shards, which must agree."""

    def listed(name: str) -> bool:
        return any(re.match(e[3:], name) if e.startswith("re:") else e == name for e in ignore)

    parent, _, leaf = layer.rpartition(".")
    shards = names.FUSED_LAYERS.get(leaf)
    if shards is None:
        return listed(layer)
    found = {listed(f"{parent}.{s}") for s in shards}
    assert len(found) == 1, f"vLLM refuses {layer}: its shards disagree on ignore {ignore}"
    return found.pop()


def vllm_mismatches(out: Path, ignore: list[str]) -> list[str]:
    """Linear layers vLLM would build expecting the wrong thing: dense but not ignored, or quantized but ignored."""
    ckpt = Checkpoint.open(out)
    modules = {names.split(t)[0] for t in ckpt.tensors if t.endswith((".weight", ".weight_packed"))}
    bad = []
    for m in sorted(modules):
        if names.is_norm(m) or names.is_embedding(m) or names.is_lm_head(m):
            continue  # RMSNorm, VocabParallelEmbedding, ParallelLMHead: not Linear layers
        dense = f"{m}.weight" in ckpt.tensors
        if vllm_ignores(vllm_layer(m), ignore) != dense:
            bad.append(f"{m} ({vllm_layer(m)}): stored {'dense' if dense else 'quantized'}")
    return bad


def quantize(tmp_path: Path, capsys, monkeypatch, *args: str) -> tuple[Path, dict]:
    """`weightsmith quantize SRC OUT --preset eagle3-draft ARGS` and the written config's quantization_config."""
    src = write_checkpoint(tmp_path / "eagle3", eagle3_tensors(), EAGLE3_CONFIG)
    out = tmp_path / "eagle3-w4a16"
    code, _, err = run(capsys, monkeypatch, "quantize", src, out, "--preset", "eagle3-draft", "--workers", "1",
                       "--no-hash", *args)  # fmt: skip
    assert code == 0, err
    return out, json.loads((out / "config.json").read_text())["quantization_config"]


def plan_reasons(tmp_path: Path, capsys, monkeypatch, *args: str) -> dict[str, str]:
    src = tmp_path / "eagle3"
    code, stdout, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "dry", "--preset", "eagle3-draft",
                            "--dry-run", "--json", *args)  # fmt: skip
    assert code == 0, err
    return {t["name"]: t["reason"] for t in json.loads(stdout)["tensors"]}


def test_eagle3_draft_quantizes_fc_and_the_midlayer_and_keeps_what_vllm_builds_dense(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, qc = quantize(tmp_path, capsys, monkeypatch)
    reasons = plan_reasons(tmp_path, capsys, monkeypatch)
    why = PRESETS["eagle3-draft"].why
    # the facts, in the plan's reasons
    assert "required for EAGLE3" in why and "without its quant_config" in why and "fc" in why
    assert reasons["embed_tokens.weight"] == f"embedding; preset eagle3-draft: {why}"
    assert reasons["lm_head.weight"] == "lm_head (vLLM's ParallelLMHead is not a Linear target)"
    assert reasons["fc.weight"].startswith("Linear weight -> ")
    assert reasons["midlayer.self_attn.q_proj.weight"].startswith("Linear weight -> ")
    assert reasons["d2t"] == reasons["t2d"] == "not a weight"
    assert reasons["midlayer.hidden_norm.weight"] == "1-D tensor"

    written = Checkpoint.open(out)
    for module in ("fc", "midlayer.self_attn.q_proj", "midlayer.mlp.down_proj"):
        assert f"{module}.weight_packed" in written.tensors and f"{module}.weight" not in written.tensors
    assert written.tensors["embed_tokens.weight"].info.dtype.code == "BF16"
    assert written.tensors["lm_head.weight"].info.dtype.code == "BF16"
    assert written.tensors["d2t"].info.dtype.code == "I64" and written.tensors["t2d"].info.dtype.code == "BOOL"
    assert qc["ignore"] == ["lm_head"]  # nothing else kept: no entry that vLLM could misread
    assert verify(out).clean
    assert vllm_mismatches(out, qc["ignore"]) == []


@pytest.mark.parametrize(
    ("args", "kept", "entries"),
    [
        # a user names the module as it is on disk: vLLM never sees that name
        (("--ignore", "midlayer.mlp.down_proj"), ["midlayer.mlp.down_proj"], ["re:(.*\\.)?mlp\\.down_proj$"]),
        # group 256 divides neither fc's 384 inputs nor the 128 of o_proj, gate_proj and up_proj
        (
            ("--group-size", "256"),
            ["fc", "midlayer.self_attn.o_proj", "midlayer.mlp.gate_proj", "midlayer.mlp.up_proj"],
            ["re:(.*\\.)?fc$", "re:(.*\\.)?self_attn\\.o_proj$", "re:(.*\\.)?mlp\\.gate_proj$",
             "re:(.*\\.)?mlp\\.up_proj$"],
        ),
    ],
)  # fmt: skip
def test_kept_linears_are_listed_by_their_name_within_the_layer(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    kept: list[str],
    entries: list[str],
) -> None:
    out, qc = quantize(tmp_path, capsys, monkeypatch, *args)
    written = Checkpoint.open(out)
    for module in kept:
        assert f"{module}.weight" in written.tensors and f"{module}.weight_packed" not in written.tensors
    assert sorted(e for e in qc["ignore"] if e.startswith("re:")) == sorted(entries)
    reasons = plan_reasons(tmp_path, capsys, monkeypatch, *args)
    assert f"listed in ignore as {entries[0]}, because vLLM loads midlayer.*" in reasons[f"{kept[0]}.weight"]
    # each entry matches the name on disk and the name vLLM builds; verify resolves them on disk
    for module, entry in zip(kept, entries, strict=True):
        assert Targets([entry], "ignore").matches(module)
        assert Targets([entry], "ignore").matches(vllm_layer(module).replace("gate_up_proj", names.leaf(module)))
    assert vllm_mismatches(out, qc["ignore"]) == []
    report = verify(out)
    assert report.clean, [f.message for f in report.findings]


def test_without_the_preset_vllm_would_misread_the_exact_name(tmp_path: Path) -> None:
    """The simulation can fail: the plain plan lists `midlayer.mlp.down_proj`, which vLLM never matches."""
    ckpt = Checkpoint.open(write_checkpoint(tmp_path / "eagle3", eagle3_tensors(), EAGLE3_CONFIG))
    plan = build_plan(ckpt, make_scheme("w4a16"), ["midlayer.mlp.down_proj"])
    assert plan.ignore == ["midlayer.mlp.down_proj", "lm_head"]
    assert not vllm_ignores(vllm_layer("midlayer.mlp.down_proj"), plan.ignore)
    assert vllm_ignores(vllm_layer("midlayer.mlp.down_proj"), ["re:(.*\\.)?mlp\\.down_proj$"])


def test_a_suffix_entry_keeps_that_module_in_every_layer(tmp_path: Path) -> None:
    """Two layers (`layers.N`, the speculators format): the entry for one layer's module matches the other's."""
    tensors = eagle3_tensors(("layers.0", "layers.1"))
    ckpt = Checkpoint.open(write_checkpoint(tmp_path / "eagle3", tensors, dict(EAGLE3_CONFIG, num_hidden_layers=2)))
    plan = build_plan(ckpt, make_scheme("w4a16"), ["layers.0.self_attn.k_proj"], "eagle3-draft")
    d = {x.name: x for x in plan.decisions}
    for layer in ("layers.0", "layers.1"):
        for p in ("q_proj", "k_proj", "v_proj"):
            assert d[f"{layer}.self_attn.{p}.weight"].action == KEEP
    assert "one ignore entry lists both" in d["layers.1.self_attn.k_proj.weight"].reason
    assert d["layers.1.self_attn.o_proj.weight"].action == QUANTIZE
    assert sorted(e for e in plan.ignore if e.startswith("re:")) == [f"re:(.*\\.)?self_attn\\.{p}_proj$" for p in "kqv"]
    for layer in (f"model.layers.{TARGET_LAYERS}", f"model.layers.{TARGET_LAYERS + 1}"):
        assert vllm_ignores(f"{layer}.self_attn.qkv_proj", plan.ignore)
        assert not vllm_ignores(f"{layer}.self_attn.o_proj", plan.ignore)


def test_the_card_calls_it_an_eagle3_draft_and_quotes_the_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = quantize(tmp_path, capsys, monkeypatch, "--ignore", "midlayer.mlp.down_proj")
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "An EAGLE3 speculative draft (" in card and "serve it with that target" in card
    assert f"`eagle3-draft`<!-- weightsmith.json: recipe.preset -->: {PRESETS['eagle3-draft'].why}." in card
    assert (
        "`re:(.*\\.)?mlp\\.down_proj$`<!-- weightsmith.json: recipe.ignore[1] -->: a Linear listed by its name "
        "within the layer (preset eagle3-draft), because vLLM loads midlayer.*" in card
    )
    assert "**not clean**" not in card
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout
