"""Determinism study on replicates with known stability, divergence and KL."""

from __future__ import annotations

import math

import pytest

from weightsmith.bench.client import TokenLogprob
from weightsmith.bench.determinism import analyse_arm, compare_arms, first_token_divergence, topk_kl
from weightsmith.bench.results import DeterminismRun, Replicate


def _pos(token: str, p: float, alt: str = "alt") -> TokenLogprob:
    return TokenLogprob(token=token, logprob=math.log(p), top={token: math.log(p), alt: math.log((1 - p) * 0.9)})


def _replicate(tokens: str, probs: list[float]) -> Replicate:
    return Replicate(content=tokens, positions=[_pos(t, p) for t, p in zip(tokens, probs, strict=True)])


def test_identical_replicates_are_fully_stable() -> None:
    run = DeterminismRun("a", "600:0", [_replicate("abcdef", [0.9] * 6) for _ in range(4)])
    d = analyse_arm(run)
    assert (d.replicates, d.errors, d.distinct_outputs, d.positions) == (4, 0, 1, 6)
    assert d.token_stable_share == 1.0 and d.bitwise_stable_share == 1.0
    assert d.first_divergence is None
    assert d.kl_within_mean == 0.0


def test_logprob_jitter_is_token_stable_but_not_bitwise() -> None:
    reps = [_replicate("abcd", [0.9, 0.8, 0.7, 0.6]), _replicate("abcd", [0.9, 0.8 + 1e-4, 0.7, 0.6])]
    d = analyse_arm(DeterminismRun("a", "k", reps))
    assert d.token_stable_share == 1.0
    assert d.bitwise_stable_share == pytest.approx(0.75)
    assert d.first_divergence is None
    assert d.kl_within_mean is not None and 0 < d.kl_within_mean < 1e-5


def test_first_divergence_is_the_earliest_token_difference() -> None:
    reps = [
        _replicate("abcdefgh", [0.9] * 8),
        _replicate("abcdeXgh", [0.9] * 8),
        _replicate("abcdefgY", [0.9] * 8),
    ]
    d = analyse_arm(DeterminismRun("a", "k", reps))
    assert d.first_divergence == 5
    assert d.distinct_outputs == 3
    assert d.token_stable_share == pytest.approx(6 / 8)
    assert first_token_divergence(reps[0].positions, reps[0].positions[:3]) == 3


def test_topk_kl() -> None:
    p = _pos("a", 0.9)
    assert topk_kl(p, p) == 0.0
    q = _pos("a", 0.6)
    assert topk_kl(p, q) > topk_kl(p, _pos("a", 0.85)) > 0
    # q did not list p's token at all: bounded by q's k-th probability, still finite and larger
    r = TokenLogprob("b", math.log(0.7), {"b": math.log(0.7), "c": math.log(0.2)})
    assert math.isfinite(topk_kl(p, r)) and topk_kl(p, r) > topk_kl(p, q)
    assert topk_kl(TokenLogprob("a", -0.1), p) is None


def test_between_arm_kl_read_against_within_arm_kl() -> None:
    stable = DeterminismRun("base", "k", [_replicate("abcd", [0.9] * 4) for _ in range(3)])
    noisy = DeterminismRun(
        "arm", "k", [_replicate("abcd", [0.9, 0.9, 0.9, 0.9]), _replicate("abcd", [0.89, 0.9, 0.9, 0.9])]
    )
    shifted = DeterminismRun("far", "k", [_replicate("abXY", [0.5] * 4) for _ in range(2)])
    within = {r.arm: analyse_arm(r) for r in (stable, noisy, shifted)}
    near = compare_arms(stable, noisy, within)
    assert near is not None and near.first_divergence is None and near.positions_compared == 4
    assert "no difference shown" in near.reading
    far = compare_arms(stable, shifted, within)
    assert far is not None and far.first_divergence == 2 and far.positions_compared == 3
    assert "repeats itself exactly" in far.reading and far.kl_between_mean > 0


def test_replicates_without_logprobs_or_with_errors() -> None:
    run = DeterminismRun("a", "k", [Replicate(content="x"), Replicate(content="y"), Replicate(error="HTTP 500")])
    d = analyse_arm(run)
    assert not d.logprobs and d.replicates == 2 and d.errors == 1 and d.distinct_outputs == 2
    assert d.bitwise_stable_share is None


def test_logprobs_for_only_some_tokens_are_compared_as_text() -> None:
    """llama-server with speculative decoding streams logprobs for only part of the tokens."""
    partial = [
        Replicate(content="abcdef", positions=[_pos("a", 0.9), _pos("d", 0.9)], completion_tokens=6),
        Replicate(content="abcXef", positions=[_pos("a", 0.9), _pos("X", 0.9)], completion_tokens=6),
    ]
    d = analyse_arm(DeterminismRun("spec", "k", partial))
    assert not d.logprobs and "2 of 6 tokens" in d.note
    assert d.first_divergence is None and d.first_divergence_char == 3
    assert d.bitwise_stable_share is None and d.kl_within_mean is None
    full = DeterminismRun("base", "k", [_replicate("abcdef", [0.9] * 6) for _ in range(2)])
    for r in full.replicates:
        r.completion_tokens = 6
    within = {r.arm: analyse_arm(r) for r in (full, DeterminismRun("spec", "k", partial))}
    pair = compare_arms(full, DeterminismRun("spec", "k", partial), within)
    assert pair is not None and pair.kl_between_mean is None and pair.positions_compared == 0
    assert pair.reading == "same text (no aligned logprobs to compare)"
