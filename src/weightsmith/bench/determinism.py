"""Is greedy decoding on this server repeatable, and do two arms differ more than an arm differs
from itself?

Temperature 0 is not bit-deterministic on real servers (batching, kernels, speculative accept
flips on near-ties). Before reading a quality difference between arms into their outputs, one must
know how much an arm disagrees with itself. For each arm, the same request is sent N times:

- bitwise-stable share: positions (up to the shortest replicate) where every replicate has the
  same token and exactly the same logprob;
- first divergence: the first position where a replicate's token differs from the first one's;
- KL within the arm (replicate 0 against each other one) set beside KL between arms (first
  replicates), from the top-k logprobs, over positions whose preceding tokens agree (after a
  token differs the contexts differ, and their distributions are no longer comparable).

KL from top-k: each side's distribution is its top-k plus one bucket for the rest; a token that
one side did not list gets the smaller of that side's k-th probability and its leftover mass.
That approximation is exact when both sides list the same tokens, and bounded otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from weightsmith.bench.client import TokenLogprob
from weightsmith.bench.results import DeterminismRun, Replicate

_EPS = 1e-12


@dataclass
class ArmDeterminism:
    """How one arm answers the same request repeatedly."""

    arm: str
    replicates: int
    errors: int
    logprobs: bool
    positions: int = 0
    distinct_outputs: int = 0
    token_stable_share: float | None = None
    bitwise_stable_share: float | None = None
    first_divergence: int | None = None
    kl_within_mean: float | None = None
    kl_within_max: float | None = None
    first_divergence_char: int | None = None
    note: str = ""


@dataclass
class PairDeterminism:
    """The first replicates of the baseline and another arm, set side by side."""

    baseline: str
    arm: str
    first_divergence: int | None
    positions_compared: int
    kl_between_mean: float | None
    kl_within_baseline: float | None
    kl_within_arm: float | None
    reading: str


def _dist(tp: TokenLogprob, support: set[str]) -> dict[str, float]:
    known = {t: math.exp(lp) for t, lp in tp.top.items()}
    if tp.logprob is not None and tp.token not in known:
        known[tp.token] = math.exp(tp.logprob)
    residual = max(0.0, 1.0 - sum(known.values()))
    missing = [t for t in support if t not in known]
    floor = min(known.values()) if known else 0.0
    fill = min(floor, residual / len(missing)) if missing else 0.0
    dist = dict(known)
    for t in missing:
        dist[t] = fill
    dist["\0rest"] = max(residual - fill * len(missing), 0.0)
    total = sum(dist.values())
    return {t: v / total for t, v in dist.items()} if total > 0 else dist


def topk_kl(p: TokenLogprob, q: TokenLogprob) -> float | None:
    """KL(p || q) between two positions' next-token distributions, from their top-k logprobs."""
    if not p.top or not q.top:
        return None
    support = set(p.top) | set(q.top) | {p.token, q.token}
    dp, dq = _dist(p, support), _dist(q, support)
    kl = sum(v * (math.log(v) - math.log(max(dq.get(t, 0.0), _EPS))) for t, v in dp.items() if v > 0)
    return max(0.0, float(kl))  # rounding can leave -1e-18 for identical distributions


def _first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    """First index where two sequences differ (the shorter one's end counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_token_divergence(a: list[TokenLogprob], b: list[TokenLogprob]) -> int | None:
    """First position whose token differs (a length difference counts); None if identical."""
    return _first_difference([x.token for x in a], [y.token for y in b])


def _aligned_kl(a: list[TokenLogprob], b: list[TokenLogprob]) -> tuple[float | None, int]:
    """Mean KL over positions up to and including the first token divergence."""
    d = first_token_divergence(a, b)
    stop = min(len(a), len(b)) if d is None else min(d + 1, len(a), len(b))
    values = [k for k in (topk_kl(a[i], b[i]) for i in range(stop)) if k is not None]
    return (sum(values) / len(values) if values else None), stop


def _aligned(replicate: Replicate) -> bool:
    """Logprobs for every generated token, so that list index = token position.

    llama-server with speculative decoding streams logprobs for only some of the tokens it
    generates; such a list cannot be compared position by position.
    """
    return bool(replicate.positions) and (
        replicate.completion_tokens is None or len(replicate.positions) == replicate.completion_tokens
    )


def first_char_divergence(a: str, b: str) -> int | None:
    """First character offset where two texts differ (None if identical)."""
    return _first_difference(a, b)


def analyse_arm(run: DeterminismRun) -> ArmDeterminism:
    """Stability of one arm's replicates."""
    good: list[Replicate] = [r for r in run.replicates if r.error is None]
    out = ArmDeterminism(
        arm=run.arm,
        replicates=len(good),
        errors=len(run.replicates) - len(good),
        logprobs=bool(good) and all(_aligned(r) for r in good),
    )
    if good and not out.logprobs:
        partial = [r for r in good if r.positions and not _aligned(r)]
        if partial:
            r = partial[0]
            out.note = (
                f"the server returned logprobs for {len(r.positions)} of {r.completion_tokens} tokens; compared as text"
            )
        else:
            out.note = "the server returned no logprobs; compared as text"
    if len(good) < 2:
        return out
    out.distinct_outputs = len({r.content for r in good})
    chars = [d for d in (first_char_divergence(good[0].content, r.content) for r in good[1:]) if d is not None]
    out.first_divergence_char = min(chars) if chars else None
    if not out.logprobs:
        return out
    seqs = [r.positions for r in good]
    length = min(len(s) for s in seqs)
    out.positions = length
    if length:
        token_stable = bitwise = 0
        for i in range(length):
            tokens = {s[i].token for s in seqs}
            if len(tokens) == 1:
                token_stable += 1
                if len({s[i].logprob for s in seqs}) == 1:
                    bitwise += 1
        out.token_stable_share = token_stable / length
        out.bitwise_stable_share = bitwise / length
    divergences = [d for d in (first_token_divergence(seqs[0], s) for s in seqs[1:]) if d is not None]
    out.first_divergence = min(divergences) if divergences else None
    kls = [k for k, _ in (_aligned_kl(seqs[0], s) for s in seqs[1:]) if k is not None]
    if kls:
        out.kl_within_mean = sum(kls) / len(kls)
        out.kl_within_max = max(kls)
    return out


def compare_arms(
    baseline: DeterminismRun, arm: DeterminismRun, within: dict[str, ArmDeterminism]
) -> PairDeterminism | None:
    """Between-arm divergence and KL, read against each arm's own repeat-to-repeat KL."""
    a = next((r for r in baseline.replicates if r.error is None), None)
    b = next((r for r in arm.replicates if r.error is None), None)
    if a is None or b is None:
        return None
    if not (_aligned(a) and _aligned(b)):
        char = first_char_divergence(a.content, b.content)
        return PairDeterminism(
            baseline=baseline.arm,
            arm=arm.arm,
            first_divergence=None,
            positions_compared=0,
            kl_between_mean=None,
            kl_within_baseline=None,
            kl_within_arm=None,
            reading="same text (no aligned logprobs to compare)"
            if char is None
            else f"texts differ from character {char} (no aligned logprobs to compare)",
        )
    kl, compared = _aligned_kl(a.positions, b.positions)
    kb = within[baseline.arm].kl_within_max if baseline.arm in within else None
    ka = within[arm.arm].kl_within_max if arm.arm in within else None
    noise = max((k for k in (ka, kb) if k is not None), default=None)
    if kl is None:
        reading = "no top-k logprobs to compare"
    elif noise is None:
        reading = "no within-arm KL to compare against (needs 2 replicates with logprobs)"
    elif kl <= noise:
        reading = "between-arm KL within the arms' own repeat-to-repeat KL: no difference shown"
    elif noise == 0:
        reading = f"between-arm KL {kl:.3g} while each arm repeats itself exactly"
    else:
        reading = f"between-arm KL {kl / noise:.1f}x the largest within-arm KL"
    return PairDeterminism(
        baseline=baseline.arm,
        arm=arm.arm,
        first_divergence=first_token_divergence(a.positions, b.positions),
        positions_compared=compared,
        kl_between_mean=kl,
        kl_within_baseline=kb,
        kl_within_arm=ka,
        reading=reading,
    )
