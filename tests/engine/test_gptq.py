"""`quantize --method gptq`: the GPTQ arithmetic against llm-compressor's, the values stored through
the scheme's own encoding, and a whole run on a tiny model (verify clean, transformers loads it,
the manifest records the method and the calibration)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from weightsmith.engine.gptq import NO_GRID, NO_TOKENS, quantize_weight
from weightsmith.formats import compressors
from weightsmith.io.manifest import load_manifest
from weightsmith.quantization.recipe import GPTQ_DAMPENING, LLM_COMPRESSOR_DAMPENING
from weightsmith.schemes import make_scheme
from weightsmith.schemes.base import Chosen

torch = pytest.importorskip("torch")


def _decompress(scheme, stored: dict) -> np.ndarray:
    return compressors.decompress(scheme.FORMAT, scheme.weight_args(), stored)


def _problem(rows: int = 96, cols: int = 192, tokens: int = 300, seed: int = 0) -> tuple:
    """A weight and a Hessian 2/n sum X^T X of correlated inputs, as calibration gives."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, cols, generator=g) * 0.05
    mix = torch.randn(cols, cols, generator=g) / cols**0.5 + torch.eye(cols)
    X = torch.randn(tokens, cols, generator=g) @ mix
    H = 2 * X.t() @ X / 4
    return W, H


@pytest.mark.parametrize("actorder", ["none", "static"])
@pytest.mark.parametrize(("name", "dtype"), [("w4a16", "f32"), ("w4a16-asym", "f32"), ("w8a16", "f32"),
                                             ("w4a16", "bf16"), ("w4a16-asym", "bf16")])  # fmt: skip
def test_values_are_llm_compressors(name: str, dtype: str, actorder: str) -> None:
    """Our column loop against llm-compressor 0.14's `quantize_weight` on the same grid: float32 scales, and
    bf16 scales (a bf16 checkpoint's, whose dequantization rounds to bf16).

    Value for value when theirs is given our linear algebra: our inverse-Hessian factor (half the
    arithmetic, `lapack.inverse_factor`) and our block products (oneDNN, `matmul.linear`). Each agrees
    with theirs to float32 rounding, and with their own linear algebra their values are ours but in the
    odd row where a rounding tie went the other way."""
    pytest.importorskip("llmcompressor")
    from compressed_tensors.quantization import QuantizationArgs
    from llmcompressor.modifiers.gptq import gptq_quantize

    from weightsmith.engine.lapack import inverse_factor
    from weightsmith.engine.matmul import linear

    scheme = make_scheme(name, 64, "none")
    W, H = _problem()
    if dtype == "bf16":
        W = W.to(torch.bfloat16).float()
        grid = scheme.grid(W.numpy().astype(ml_dtypes.bfloat16))
        scale = torch.from_numpy(grid.scale.astype(np.float32)).to(torch.bfloat16)
    else:
        grid = scheme.grid(W.numpy())
        scale = torch.from_numpy(grid.scale)
    codes, ours, singular = quantize_weight(W, H.clone(), grid, LLM_COMPRESSOR_DAMPENING, actorder=actorder)
    args = QuantizationArgs(
        num_bits=scheme.num_bits, type="int", symmetric=scheme.symmetric, strategy="group", group_size=64,
        actorder=None if actorder == "none" else actorder,
    )  # fmt: skip
    zp = (
        torch.zeros(grid.scale.shape, dtype=torch.int8)
        if grid.zero_point is None
        else torch.from_numpy(grid.zero_point)
    )

    def reference() -> torch.Tensor:
        values, _, fallback = gptq_quantize.quantize_weight(W[None].clone(), H[None].clone(), scale[None], zp[None],
                                                            None, args)  # fmt: skip
        assert not bool(fallback[0])
        return values[0]

    factorize, factors = gptq_quantize.factorize_hessian, {}

    def our_factor(weights, hessians, percdamp, used_rtn_fallback):  # their dampening (no dead columns), our factor
        damped = hessians.clone()
        torch.diagonal(damped, dim1=-2, dim2=-1).add_(percdamp * torch.diagonal(damped, dim1=-2, dim2=-1).mean(-1))
        factors["theirs"] = factorize(weights, hessians, percdamp, used_rtn_fallback)[0].clone()
        factors["ours"] = torch.from_numpy(inverse_factor(damped[0].numpy()))
        return hessians.copy_(factors["ours"][None])

    def our_product(errors: torch.Tensor, block_row: torch.Tensor) -> torch.Tensor:  # their one bmm
        return linear(block_row[0].t(), errors[0]).t()[None]

    theirs_own = reference()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gptq_quantize, "factorize_hessian", our_factor)
        mp.setattr(gptq_quantize.torch, "bmm", our_product)
        theirs = reference()
    assert not singular
    assert torch.equal(ours, theirs)
    assert float((factors["ours"] - factors["theirs"]).abs().max() / factors["theirs"].abs().max()) < 1e-5
    flipped = (ours != theirs_own).any(dim=1)  # a tie that went the other way moves the rest of its row
    assert float(flipped.float().mean()) <= 0.05, f"{int(flipped.sum())} of {len(flipped)} rows differ"
    # the codes are the points of the grid the dequantized values stand on
    q = codes.astype(np.float32)
    if grid.zero_point is not None:
        q = q - np.repeat(grid.zero_point.astype(np.float32), 64, axis=1)
    steps = torch.from_numpy(np.repeat(grid.scale.astype(np.float32), 64, axis=1)).to(scale.dtype)
    dq = torch.from_numpy(q).to(scale.dtype) * steps
    assert torch.equal(dq.float(), ours)
    # and GPTQ lowers the output error against round-to-nearest on the same grid
    rtn = torch.from_numpy(_decompress(scheme, _stored(scheme, W.numpy(), None)))

    def loss(Wq: torch.Tensor) -> float:
        D = Wq - W
        return float(torch.einsum("ij,jk,ik->", D, H, D))

    assert loss(ours) < 0.8 * loss(rtn)


def _stored(scheme, w: np.ndarray, param) -> dict[str, np.ndarray]:
    """The on-disk tensors `encode` writes for a whole weight, by parameter name."""
    writes, bad = scheme.encode(w, 0, w.shape, param)
    assert bad == -1
    return {name: data for name, data, _ in writes}


@pytest.mark.parametrize("name", ["w4a16", "w4a16-asym", "w8a16", "w4afp8"])
def test_chosen_values_are_stored_with_the_schemes_own_encoding(name: str) -> None:
    """Given round-to-nearest's own values, encode writes exactly what it writes without them;
    given other values, only the packed weight changes, and it decodes to them."""
    scheme = make_scheme(name, 64, "none")
    W, H = _problem()
    w = W.numpy()
    grid = scheme.grid(w)
    plain = _stored(scheme, w, None)
    rtn_codes = np.clip(np.round(w / np.repeat(grid.scale, 64, axis=1)
                                 + (0 if grid.zero_point is None else np.repeat(grid.zero_point, 64, axis=1))),
                        grid.q_min, grid.q_max).astype(np.int8)  # fmt: skip
    same = _stored(scheme, w, Chosen(rtn_codes))
    assert plain.keys() == same.keys() and all(np.array_equal(plain[k], same[k]) for k in plain)
    codes, dequantized, _ = quantize_weight(W, H.clone(), grid)
    chosen = _stored(scheme, w, Chosen(codes))
    values = "weight_packed" if "weight_packed" in plain else "weight"  # W4AFP8 stores one int8 per value
    assert not np.array_equal(chosen[values], plain[values])
    assert all(np.array_equal(plain[k], chosen[k]) for k in plain if k != values)
    assert np.array_equal(_decompress(scheme, chosen).astype(np.float32), dequantized.numpy())


@pytest.mark.parametrize(("name", "search"), [("w4a16", "wmse"), ("w4a16-asym", "wmse"), ("w4a16", "mse"),
                                              ("w4a16", "noclip")])  # fmt: skip
def test_gptq_on_a_searched_grid_stores_that_grids_scales(name: str, search: str) -> None:
    """On a searched grid, GPTQ with an identity Hessian (nothing to compensate) stores exactly what
    the search alone stores; with a real Hessian only the values change, still on the searched scales."""
    scheme = make_scheme(name, 64, search)
    W, H = _problem()
    w = W.numpy()
    grid = scheme.grid(w)
    assert grid is not None and grid.shrink is not None and not np.all(grid.shrink == 1)
    searched = _stored(scheme, w, None)
    codes, _, _ = quantize_weight(W, torch.eye(w.shape[1]), grid)
    same = _stored(scheme, w, Chosen(codes, grid.shrink))
    assert searched.keys() == same.keys() and all(np.array_equal(searched[k], same[k]) for k in searched)
    codes, dequantized, _ = quantize_weight(W, H.clone(), grid)
    chosen = _stored(scheme, w, Chosen(codes, grid.shrink))
    assert not np.array_equal(chosen["weight_packed"], searched["weight_packed"])
    assert all(np.array_equal(searched[k], chosen[k]) for k in searched if k != "weight_packed")
    assert np.array_equal(_decompress(scheme, chosen).astype(np.float32), dequantized.numpy())


def test_singular_hessian_falls_back_to_round_to_nearest() -> None:
    scheme = make_scheme("w4a16", 64, "none")
    W, _ = _problem()
    H = -torch.eye(W.shape[1])  # not positive definite, whatever the dampening
    _, dequantized, singular = quantize_weight(W, H, scheme.grid(W.numpy()))
    assert singular
    rtn = _decompress(scheme, _stored(scheme, W.numpy(), None))
    assert np.array_equal(dequantized.numpy(), rtn)


def test_dead_columns_are_zeroed_as_llm_compressor_does() -> None:
    scheme = make_scheme("w4a16", 64, "none")
    W, H = _problem()
    H[:, 5] = 0
    H[5, :] = 0
    _, dequantized, singular = quantize_weight(W, H, scheme.grid(W.numpy()))
    assert not singular and torch.all(dequantized[:, 5] == 0)


def test_gptq_run_on_a_tiny_model(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """The whole command: warns about too few tokens, writes a checkpoint `verify` passes and
    transformers loads, and records the method and the calibration in the manifest."""
    from hostile.harness import run_inprocess
    from weightsmith.audit.verify import verify

    out = tmp_path / "gptq"
    result = run_inprocess(
        capsys, monkeypatch, "quantize", tiny_llama, out, "--method", "gptq", "--group-size", "32",
        "--builtin", "code", "--tokens", "64", "--seq-len", "32",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "64 calibration tokens" in result.err and "dampening (0.1 of its mean diagonal)" in result.err
    assert verify(out).clean
    manifest = load_manifest(out / "weightsmith.json")
    assert manifest.method is not None and manifest.method.name == "gptq"
    assert manifest.method.tokens == 64 and manifest.method.dampening == 0.1 and manifest.method.rtn_fallback == {}
    assert manifest.calibration is not None and manifest.calibration.tokens == 64
    assert manifest.calibration.text.startswith("builtin:code")
    assert json.loads((out / "weightsmith.json").read_text())["method"]["name"] == "gptq"
    assert not list(tmp_path.glob("*.partial-*"))

    # the card says how the values were chosen, and its check re-derives every number of it
    assert run_inprocess(capsys, monkeypatch, "card", out).code == 0
    card = (out / "README.md").read_text()
    assert "chosen by `gptq`" in card and "activation order `static`" in card
    assert "(dampening 0.1<!-- weightsmith.json: method.dampening --> of the mean Hessian diagonal" in card
    assert run_inprocess(capsys, monkeypatch, "card", out, "--check").code == 0

    # --json says where the time went, phase by phase, within the run's own seconds
    from weightsmith.engine.gptq import PHASES

    result = run_inprocess(
        capsys, monkeypatch, "quantize", tiny_llama, tmp_path / "json", "--method", "gptq", "--group-size", "32",
        "--builtin", "code", "--tokens", "64", "--seq-len", "32", "--json",
    )  # fmt: skip
    report = json.loads(result.out)
    assert list(report["engine_split"]) == list(PHASES)
    assert 0 < sum(report["engine_split"].values()) <= report["seconds"]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(8)[None]).logits).all()


def test_a_layers_groups_on_two_threads_give_the_values_of_one(tiny_llama: Path, tmp_path: Path) -> None:
    """`run` quantizes a layer's groups (q/k/v, o, gate/up, down) on `workers` threads at once, torch
    on one thread each: the values are those of one worker, byte for byte, for every module."""
    from weightsmith.calibration.measure import calibration_tokens
    from weightsmith.engine import gptq
    from weightsmith.io.checkpoint import Checkpoint
    from weightsmith.quantization.plan import QUANTIZE, build_plan

    plan = build_plan(Checkpoint.open(tiny_llama), make_scheme("w4a16", 32, "none"))
    targets = {d.module: gptq.Target(d.rule.scheme, np.dtype(np.float32))
               for d in plan.decisions if d.action == QUANTIZE and d.rule is not None}  # fmt: skip
    tokens = calibration_tokens(tiny_llama, None, "code", 128, 32)[0]
    found = {}
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        found[workers] = gptq.run(tiny_llama, tokens, targets, tmp_path / str(workers), workers=workers)
    assert found[1].rtn == found[2].rtn and len(found[1].chosen) > 4
    assert list(found[2].seconds) == list(gptq.PHASES[2:]) and all(t > 0 for t in found[2].seconds.values())
    assert found[1].chosen.keys() == found[2].chosen.keys()
    for module, chosen in found[1].chosen.items():
        assert np.array_equal(chosen.codes, found[2].chosen[module].codes), module


def test_a_failing_group_stops_the_layer_without_running_the_queued_ones() -> None:
    """The error of one group reaches the caller, and the groups still queued are dropped, not run to
    the end first (a 70B down_proj takes minutes): at most the one a worker had already started."""
    import time

    from weightsmith.engine.gptq import _in_parallel

    started: list[str] = []

    def quantize_group(members: list[str], hessian: object) -> dict:
        started.append(members[0])
        if members[0] == "widest":
            raise RuntimeError("boom")
        time.sleep(0.2)
        return {}

    groups = [([f"narrow{i}"], torch.zeros(4, 4)) for i in range(4)] + [(["widest"], torch.zeros(8, 8))]
    with pytest.raises(RuntimeError, match="boom"):
        _in_parallel(quantize_group, groups, workers=1)
    assert started[0] == "widest" and len(started) <= 2


def test_a_module_without_a_grid_leaves_only_itself_to_round_to_nearest(tmp_path: Path) -> None:
    """q and k share one input; q's scheme is memoryless_mse (no grid before a first pass), k's is plain:
    k still gets GPTQ's values, and only q is left to its scheme, with the reason. A group where no
    member has a grid is all left."""
    from weightsmith.engine.distributed import World
    from weightsmith.engine.gptq import NO_GRID, Result, Target, _keep, _quantize_group, _share

    W, H = _problem(rows=64, cols=128)
    linears = {m: torch.nn.Linear(128, 64, bias=False) for m in ("q", "k", "v")}
    for module in linears.values():
        module.weight.data.copy_(W)
    f32 = np.dtype(np.float32)
    targets = {
        "q": Target(make_scheme("w4a16", 64, "memoryless_mse"), f32),
        "k": Target(make_scheme("w4a16", 64, "none"), f32),
        "v": Target(make_scheme("nvfp4a16"), f32),
    }
    result = Result()
    common = dict(linears=linears, targets=targets, dampening=GPTQ_DAMPENING, block_size=128, actorder="static")

    def solve(members: list[str]) -> None:
        solved = _quantize_group(members, H.clone(), **common)
        _share(solved, [(members, H)], {members[0]: 0}, linears, targets, World())
        _keep(solved, tmp_path, result)

    solve(["q", "k"])
    assert result.rtn == {"q": NO_GRID} and list(result.chosen) == ["k"]
    assert not torch.equal(linears["k"].weight, W) and torch.equal(linears["q"].weight, W)
    solve(["v"])
    assert result.rtn == {"q": NO_GRID, "v": NO_GRID} and list(result.chosen) == ["k"]


#: A layer's Linears as `_structure` checks rank 0's groups against them: q/k read 64 columns, down 128.
LAYER_WIDTHS = {"q": 64, "k": 64, "down": 128}


@pytest.mark.parametrize(
    "told",
    [
        None,  # bytes that were not JSON
        {"q": 64},
        [[["q"], 64, 1]],
        [[[], 64]],
        [[["x"], 64]],
        [[["q", "q"], 64]],
        [[["q"], 64], [["q", "k"], 64]],
        [[["q"], 1 << 40]],
        [[["q"], True]],
        [[[3], 64]],
    ],
    ids=["not-json", "not-a-list", "three-parts", "no-members", "not-a-module", "twice-in-one", "in-two-groups",
         "other-width", "bool-width", "not-a-name"],
)  # fmt: skip
def test_a_layers_groups_not_of_its_modules_are_one_line_naming_rank_0(told: object) -> None:
    """Every rank sizes and assigns its Hessians by rank 0's groups of the layer: a group that is not a
    list of this layer's modules, each named once, with the width they read, is refused before any
    Hessian of that width is made."""
    from weightsmith.core.errors import WeightsmithError
    from weightsmith.engine.distributed import World
    from weightsmith.engine.gptq import _structure

    linears = {m: torch.nn.Linear(width, 32, bias=False) for m, width in LAYER_WIDTHS.items()}
    assert _structure([[["q", "k"], 64], [["down"], 128]], linears, World(1, 2)) == [(["q", "k"], 64), (["down"], 128)]
    with pytest.raises(WeightsmithError) as refused:
        _structure(told, linears, World(1, 2))
    assert str(refused.value) == (
        "rank 0 of 2 sent the layer's groups of modules as something other than a JSON list of groups of this "
        "layer's modules, each named once, with the input width they read"
    )


@pytest.mark.parametrize(
    "told",
    [
        None,
        # a reason of the sender's own text would be written into the manifest
        {"valued": True, "shrink": False, "fallback": "\x1b[2Jany text", "tokens": None},
        {"valued": 1, "shrink": False, "fallback": None, "tokens": None},
        {"valued": True, "shrink": 0, "fallback": None, "tokens": None},
        {"valued": False, "shrink": False, "fallback": None, "tokens": None},
        {"valued": False, "shrink": True, "fallback": NO_GRID, "tokens": None},
        {"valued": True, "shrink": False, "fallback": None, "tokens": None, "codes": "..."},
        {"valued": True, "shrink": False, "fallback": None, "tokens": -1},  # a count is never negative
        {"valued": True, "shrink": False, "fallback": None, "tokens": 1.5},
        {"valued": True, "shrink": False, "fallback": None, "tokens": True},
    ],
    ids=[
        "not-json", "other-reason", "int-flag", "int-shrink", "no-values-no-reason", "no-grid-with-clip", "extra",
        "negative-tokens", "float-tokens", "bool-tokens",
    ],
)
def test_a_module_outcome_not_as_gptq_gives_it_is_one_line(told: object) -> None:
    """A module's outcome from its owner is one `_quantize_group` gives (values, or the no-grid reason);
    anything else, a reason of the sender's own text included, is refused naming the sender."""
    from weightsmith.core.errors import WeightsmithError
    from weightsmith.engine.distributed import Message
    from weightsmith.engine.gptq import SINGULAR, _outcome

    message = Message("sharing q", "sent the outcome of q", "a JSON outcome of GPTQ")
    good = {"valued": True, "shrink": True, "fallback": SINGULAR, "tokens": None}
    assert _outcome(good, message, 1, 2) == (True, True, SINGULAR, None)
    good = {"valued": False, "shrink": False, "fallback": NO_GRID, "tokens": 7}
    assert _outcome(good, message, 1, 2) == (False, False, NO_GRID, 7)
    good = {"valued": False, "shrink": False, "fallback": NO_TOKENS, "tokens": 0}
    assert _outcome(good, message, 1, 2) == (False, False, NO_TOKENS, 0)
    with pytest.raises(WeightsmithError, match=r"^rank 1 of 2 sent the outcome of q as something other than a JSON"):
        _outcome(told, message, 1, 2)


def test_clip_factors_not_of_the_grid_s_shape_are_one_line() -> None:
    """The clip factors a module's owner sends must have exactly the grid's shape (a row per weight row, a
    column per group), which the int4 kernels read without bounds checks: 4 x 8 values for a 2 x 16
    grid fit `broadcast_array`'s count and are still refused, naming the sender."""
    from weightsmith.core.errors import WeightsmithError
    from weightsmith.engine.distributed import World
    from weightsmith.engine.gptq import _told

    class Peer(World):
        """Rank 0 of 2, told by rank 1 that module q was searched, then sent factors of another shape."""

        def broadcast_json(self, value: object, source: int, message: object) -> object:
            return {"valued": True, "shrink": True, "fallback": None, "tokens": None}

        def broadcast_array(self, array: object, source: int, message: object, dtype: str, most: int) -> object:
            return np.zeros((4, 8), dtype=np.float32)

    with pytest.raises(WeightsmithError) as refused:
        _told(None, "q", 1, (2, 32), 2, Peer(0, 2))
    assert str(refused.value) == "rank 1 of 2 sent the clip factors of q of shape [4, 8], not [2, 16]"


def test_an_expert_row_count_below_zero_is_one_line_naming_the_sender() -> None:
    """An expert group's owner reads each sender's row count before anything of that size is made: a
    negative count is refused naming the sender; rows fewer than the width are summed with `add_gram`
    as the sender would have, so a count and its rows give the owner's own product."""
    from weightsmith.core.errors import WeightsmithError
    from weightsmith.engine.distributed import World
    from weightsmith.engine.gptq import _exchange_expert
    from weightsmith.engine.matmul import add_gram

    rows = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7

    def peer(count: int) -> World:
        """Rank 0 of 2, the owner, told by rank 1 `count` and then sent its rows."""
        told = [torch.tensor([count]), rows]

        class Told(World):
            def receive(self, source: int, shape: tuple[int, ...], dtype: str = "float32") -> object:
                return told.pop(0)

        return Told(0, 2)

    with pytest.raises(WeightsmithError) as refused:
        _exchange_expert("e.gate_proj", 4, {}, {}, {}, 0, [0, 1], peer(-5))
    assert str(refused.value) == "rank 1 of 2 sent -5 input rows of e.gate_proj (a count is never negative)"

    sums: dict = {}
    tokens: dict = {}
    _exchange_expert("e.gate_proj", 4, {}, sums, tokens, 0, [0, 1], peer(3))
    expected = torch.zeros(4, 4)
    add_gram(expected, rows, alpha=2.0)
    assert torch.equal(sums["e.gate_proj"], expected) and tokens == {"e.gate_proj": 3}
