"""MoE models on the engine: GPTQ on every routed and shared expert, calibration under the checkpoint's
names, and the served model's recipe (NVFP4 W4A4 experts, static FP8 attention and shared expert, an
FP8 KV cache) written and verified, on a tiny random model of each MoE family built from its
transformers config (layer 0 dense, 8 experts with top-2 routing, a shared expert where the family has
one), with SmolLM2's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from engine.tiny_models import MOE_FAMILIES, SEED3, save_tiny

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", params=sorted(MOE_FAMILIES))
def moe(request: pytest.FixtureRequest, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model of each MoE family, in a folder named after it."""
    family = request.param
    return save_tiny(tmp_path_factory.mktemp("moe") / family, family, tokenizer=smollm2, shapes=MOE_FAMILIES[family])


def _expert_modules(folder: Path) -> set[str]:
    from weightsmith.engine.experts import expert_modules
    from weightsmith.engine.loading import opened

    with opened(folder) as loader:
        return expert_modules(loader.experts)


def test_gptq_chooses_every_expert_and_the_shared_expert(moe: Path, tmp_path: Path) -> None:
    """With every token through every expert (`all_experts`) no module is left to round-to-nearest: every
    routed expert's projections and the shared expert's have GPTQ's values, under the checkpoint's names
    (Laguna's `shared_expert`, which transformers calls `shared_experts`); verify passes."""
    import weightsmith as ws

    request = ws.QuantizeRequest(
        source=moe, output=tmp_path / "q", method="gptq", group_size=32,
        gptq=ws.GptqOptions(tokens=256, seq_len=64, all_experts=True),
    )  # fmt: skip
    result = ws.quantize(request)
    method = result.manifest.method
    assert method is not None and method.rtn_fallback == {} and method.few_tokens == {} and method.all_experts
    experts = _expert_modules(moe)
    moe_layers = 3 if moe.name == "mixtral" else 2  # the others keep layer 0 dense
    assert len(experts) == moe_layers * 8 * 3  # 8 experts a layer, 3 projections each
    from safetensors import safe_open

    with safe_open(tmp_path / "q" / "model.safetensors", "np") as f:
        names = set(f.keys())
    assert all(f"{m}.weight_packed" in names for m in experts)
    shared = {n for n in names if ".shared_expert." in n and n.endswith(".weight_packed")}
    assert len(shared) == (6 if "shared_expert_intermediate_size" in MOE_FAMILIES[moe.name] else 0)
    assert ws.verify(tmp_path / "q").clean


def test_experts_no_token_reached_are_named_with_their_reason(moe: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """Routed as the model routes, an expert's Hessian is its own tokens': one with fewer rows than its
    width is counted in `few_tokens`, one with none is left to round-to-nearest saying so, and nothing
    else is left (the reasons are only those two). The run says how many, and so does the card, whose
    check re-derives the counts."""
    import weightsmith as ws
    from weightsmith.engine.gptq import NO_TOKENS

    said: list[str] = []
    request = ws.QuantizeRequest(
        source=moe, output=tmp_path / "q", method="gptq", group_size=32, gptq=ws.GptqOptions(tokens=64, seq_len=32)
    )
    result = ws.quantize(request, ws.Hooks(warn=said.append))
    method = result.manifest.method
    assert method is not None and not method.all_experts
    assert set(method.rtn_fallback.values()) <= {NO_TOKENS}
    assert set(method.rtn_fallback) <= set(method.few_tokens) <= _expert_modules(moe)
    assert all(method.few_tokens[m] == 0 for m in method.rtn_fallback)
    assert method.few_tokens, "64 tokens over 8 experts of width 64 leave some expert short"
    assert any("--all-experts" in line and f"{len(method.few_tokens):,} MoE expert modules" in line for line in said)

    from hostile.harness import run_inprocess

    assert run_inprocess(capsys, monkeypatch, "card", tmp_path / "q").code == 0
    card = (tmp_path / "q" / "README.md").read_text()
    assert f"{len(method.few_tokens):,}<!-- weightsmith.json: method.few_tokens --> MoE expert modules" in card
    if method.rtn_fallback:
        assert f"{len(method.rtn_fallback):,}<!-- weightsmith.json: method.rtn_fallback --> modules were left" in card
    assert run_inprocess(capsys, monkeypatch, "card", tmp_path / "q", "--check").code == 0


def test_an_experts_values_are_gptq_on_the_tokens_routed_to_it(smollm2: Path, tmp_path: Path) -> None:
    """The values the engine chooses for layer 1's experts equal `quantize_weight` given each expert's
    Hessian made here from transformers' own whole-model run: the tokens routed to it for gate and up
    (one Hessian, their rows stacked), and act(gate) * up of those tokens for down; 0.1 % may differ,
    where the two float32 sums round differently."""
    import transformers

    from weightsmith.calibration.measure import calibration_tokens
    from weightsmith.engine import gptq
    from weightsmith.schemes import make_scheme

    src = save_tiny(tmp_path / "src", "qwen2_moe", tokenizer=smollm2, shapes=MOE_FAMILIES["qwen2_moe"])
    scheme = make_scheme("w4a16", 32, "none")
    f32 = np.dtype(np.float32)
    prefix = "model.layers.1.mlp.experts"
    projections = ("gate_proj", "up_proj", "down_proj")
    targets = {f"{prefix}.{e}.{p}": gptq.Target(scheme, f32) for e in range(8) for p in projections}
    sequences = calibration_tokens(src, None, "code", 512, 64)[0]
    found = gptq.run(src, sequences, targets, tmp_path)
    assert set(found.chosen) | set(found.rtn) == set(targets) and len(found.chosen) >= 12

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    model.config._experts_implementation = "eager"
    experts = model.model.layers[1].mlp.experts
    hessians: dict[int, list] = {}

    def record(_module, args) -> None:
        hidden, index = args[0], args[1]
        for e in range(8):
            x = hidden[(index == e).any(-1)]
            if not len(x):
                continue
            gate, up = (x @ experts.gate_up_proj[e].T).chunk(2, dim=-1)
            h = experts.act_fn(gate) * up
            sums = hessians.setdefault(e, [torch.zeros(64, 64), torch.zeros(32, 32)])
            sums[0] += 2 * x.T @ x
            sums[1] += 2 * h.T @ h

    hook = experts.register_forward_pre_hook(record)
    with torch.no_grad():
        for ids in sequences:
            model(torch.tensor([ids]))
    hook.remove()

    compared = agree = 0
    for e, (h_in, h_down) in hessians.items():
        gate_up = experts.gate_up_proj[e].detach()
        for rows, hessian, names in (
            (gate_up, h_in, ("gate_proj", "up_proj")),
            (experts.down_proj[e].detach(), h_down, ("down_proj",)),
        ):
            grids = [scheme.grid(w.numpy()) for w in rows.chunk(len(names))]
            grid = type(grids[0])(
                np.concatenate([g.scale for g in grids]),
                None,
                grids[0].group,
                grids[0].q_min,
                grids[0].q_max,
            )
            codes, _, _ = gptq.quantize_weight(rows.clone(), hessian / len(sequences), grid)
            mine = np.concatenate([found.chosen[f"{prefix}.{e}.{n}"].codes for n in names])
            compared += codes.size
            agree += int((codes == mine).sum())
    assert compared > 0 and agree / compared > 0.999, f"{agree} of {compared} values agree"


def test_calibration_names_every_expert_and_the_served_recipe_writes(
    moe: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """calibrate writes the input maxima under the checkpoint's names (every expert's, with
    `all_experts`, which its record says and the quantized checkpoint's manifest and card repeat), and the
    served model's recipe (NVFP4 W4A4 experts with their activation scales, static FP8 attention and
    shared expert, `--kv-cache fp8`) writes and verifies on every MoE family."""
    import weightsmith as ws
    from clirun import run
    from weightsmith.calibration import stats_file
    from weightsmith.core.errors import WeightsmithError
    from weightsmith.io.manifest import MANIFEST_FILE, load_manifest

    stats = tmp_path / "stats.safetensors"
    ws.calibrate(moe, stats, tokens=256, seq_len=64, all_experts=True)
    assert stats_file.read(stats).provenance.experts == "every token"
    measured = stats_file.read(stats).inputs
    assert _expert_modules(moe) <= set(measured)
    with safe_open(moe / "model.safetensors", "np") as f:
        on_disk = {name.rsplit(".", 1)[0] for name in f.keys()}  # noqa: SIM118
    assert set(measured) <= on_disk  # the checkpoint's names: Laguna's shared_expert, not transformers' shared_experts
    recipe = tmp_path / "seed3.toml"
    recipe.write_text(SEED3)
    out = tmp_path / "q"
    kv_cache: str | None = "fp8"
    if moe.name == "deepseek_v3":  # latent attention caches no K and V: an FP8 KV cache is refused, saying so
        with pytest.raises(WeightsmithError, match="DeepSeek's latent attention caches one compressed vector"):
            ws.quantize(ws.QuantizeRequest(source=moe, output=out, recipe=recipe, calibration=stats, kv_cache="fp8"))
        kv_cache = None
    ws.quantize(ws.QuantizeRequest(source=moe, output=out, recipe=recipe, calibration=stats, kv_cache=kv_cache))
    assert ws.verify(out).clean
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert kv_cache is None or config["kv_cache_scheme"]["num_bits"] == 8
    calibration = load_manifest(out / MANIFEST_FILE).calibration
    assert calibration is not None and calibration.experts == "every token"
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    assert "each routed expert's over every token" in (out / "README.md").read_text()

    # eval scores it as served: every stored activation scale applied, the experts' included
    from weightsmith.engine.loading import opened
    from weightsmith.fidelity.activations import input_quantizers, served_inputs

    with opened(out) as loader:
        quantizers = input_quantizers(loader.source.ckpt)
        assert _expert_modules(moe) <= set(quantizers)
        applied = 0
        for index in range(len(loader.skeleton.layers)):  # a layer at a time, as `eval --stream` runs
            loader.load(index)
            with served_inputs(loader, quantizers, index) as count:
                applied += count
        with served_inputs(loader, quantizers) as count:  # every layer at once, as the in-memory eval runs
            assert count == len(quantizers)
    assert applied == len(quantizers)
    report = ws.evaluate(moe, out, tokens=64)
    assert report.logits.status == "ok" and report.logits.kl > 0, report.logits.reason


@pytest.mark.parametrize("scheme", ["w4a16-asym", "nvfp4a16", "fp8-dynamic", "experts-bf16"])
def test_eval_scores_every_layout(moe: Path, tmp_path: Path, scheme: str) -> None:
    """eval gives a KL for each scheme's output on each MoE family, and for experts kept BF16 beside
    quantized attention (transformers' compressed-tensors loader refuses experts under a quantization
    config, or leaves BF16 ones random; eval loads them through our decompressors), and the in-memory
    and layer-streamed figures agree."""
    import weightsmith as ws

    out = tmp_path / scheme
    if scheme == "experts-bf16":
        recipe = tmp_path / "attention.toml"
        recipe.write_text('[[rule]]\ntargets = ["category:attention"]\nscheme = "w4a16"\ngroup_size = 32\n')
        ws.quantize(ws.QuantizeRequest(source=moe, output=out, recipe=recipe))
    else:  # groups of 32: the tiny models' widths (64, and the experts' 32) take them, so the experts are quantized
        group = 32 if scheme == "w4a16-asym" else None
        ws.quantize(ws.QuantizeRequest(source=moe, output=out, scheme=scheme, group_size=group))
    memory = ws.evaluate(moe, out, tokens=64).logits
    stream = ws.evaluate(moe, out, tokens=64, stream=True).logits
    assert memory.status == stream.status == "ok", (memory.reason, stream.reason)
    assert memory.kl > 0 and stream.kl == pytest.approx(memory.kl, rel=1e-3, abs=1e-6)


def test_an_expert_no_token_reached_is_named_by_calibrate_and_refused_by_quantize(
    smollm2: Path, tmp_path: Path
) -> None:
    """Routed as the model routes, an expert no token reached has no input maximum: calibrate says how
    many and names --all-experts, and quantize's refusal of a static scheme on it says the same."""
    import weightsmith as ws
    from weightsmith.calibration import stats_file
    from weightsmith.core.errors import WeightsmithError

    src = save_tiny(tmp_path / "src", "qwen2_moe", tokenizer=smollm2, shapes=MOE_FAMILIES["qwen2_moe"])
    said: list[str] = []
    stats = tmp_path / "stats.safetensors"
    ws.calibrate(src, stats, tokens=16, seq_len=16, warn=said.append)
    assert stats_file.read(stats).provenance.experts == "routed"
    unreached = [line for line in said if "were routed no calibration token" in line]
    assert len(unreached) == 1 and "--all-experts" in unreached[0]
    recipe = tmp_path / "seed3.toml"
    recipe.write_text(SEED3)
    refusal = r"an MoE expert no calibration token was routed to: calibrate --all-experts"
    with pytest.raises(WeightsmithError, match=refusal):
        ws.quantize(ws.QuantizeRequest(source=src, output=tmp_path / "q", recipe=recipe, calibration=stats))
    assert not (tmp_path / "q").exists()


def test_an_expert_projection_left_unquantized_keeps_its_whole_moe_layer(moe: Path) -> None:
    """Groups of 64 divide the hidden size (gate/up's inputs) but not the experts' 32-wide down_proj: vLLM
    refuses a FusedMoE whose projections differ in scheme, so every routed expert projection of the layer
    is kept with the one that had to be, saying why; the other Linears are quantized as asked."""
    import weightsmith as ws
    from weightsmith.io import names
    from weightsmith.quantization.plan import KEEP, QUANTIZE

    plan = ws.plan_quantize(ws.QuantizeRequest(source=moe, output=None, scheme="w4a16", group_size=64))
    weights = [d for d in plan.decisions if d.param == names.WEIGHT and len(d.shape) == 2]
    experts = [d for d in weights if names.is_routed_expert(d.module)]
    narrow = [d for d in experts if d.shape[1] % 64]
    if not narrow:  # Mixtral's experts are the tiny models' 128-wide MLPs: every projection takes groups of 64
        assert experts and all(d.action == QUANTIZE for d in experts)
        return
    assert all(d.action == KEEP for d in experts)
    assert all("not a multiple of the group size 64" in d.reason for d in narrow)
    assert all("one FusedMoE layer" in d.reason for d in experts if d not in narrow)
    assert any(d.action == QUANTIZE for d in weights if ".self_attn." in d.module)
    assert set(plan.ignore) >= {d.module for d in experts}
