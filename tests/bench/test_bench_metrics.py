"""Acceptance from /metrics: vLLM's and llama.cpp's exact exposition, deltas, resets, absences."""

# ruff: noqa: E501 (exposition lines are kept whole)

from __future__ import annotations

import httpx
import pytest

from weightsmith.bench import metrics as m
from weightsmith.bench.kinds import VLLM_METRICS


def _snap(text: str) -> m.Snapshot:
    return m.Snapshot(samples=m.parse_exposition(text))


# vLLM's exposition as prometheus_client writes it for vLLM's registration (SpecDecodingProm,
# labels model_name/engine/position), including the `_created` gauges, two data-parallel engines
# and a second served model that must be filtered out.
VLLM_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 106.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 5.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7959832182002308e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 318.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="other"} 15.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 121.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 15.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 75.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 46.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.004
"""


def _after(text: str, changes: dict[str, str]) -> str:
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


VLLM_AFTER = _after(
    VLLM_BEFORE,
    {
        'drafts_total{engine="0",model_name="m"} 106.0': 'drafts_total{engine="0",model_name="m"} 146.0',
        'drafts_total{engine="1",model_name="m"} 10.0': 'drafts_total{engine="1",model_name="m"} 20.0',
        'drafts_total{engine="0",model_name="other"} 5.0': 'drafts_total{engine="0",model_name="other"} 500.0',
        'draft_tokens_total{engine="0",model_name="m"} 318.0': 'draft_tokens_total{engine="0",model_name="m"} 438.0',
        'draft_tokens_total{engine="1",model_name="m"} 30.0': 'draft_tokens_total{engine="1",model_name="m"} 60.0',
        'accepted_tokens_total{engine="0",model_name="m"} 121.0': 'accepted_tokens_total{engine="0",model_name="m"} 201.0',
        'accepted_tokens_total{engine="1",model_name="m"} 12.0': 'accepted_tokens_total{engine="1",model_name="m"} 22.0',
        'model_name="m",position="0"} 75.0': 'model_name="m",position="0"} 115.0',
        'model_name="m",position="1"} 46.0': 'model_name="m",position="1"} 76.0',
        'model_name="m",position="2"} 0.0\nvllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1"': (
            'model_name="m",position="2"} 10.0\nvllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1"'
        ),
        'engine="1",model_name="m",position="0"} 8.0': 'engine="1",model_name="m",position="0"} 18.0',
    },
)


def test_vllm_window_sums_engines_and_filters_the_model() -> None:
    w = m.spec_window(_snap(VLLM_BEFORE), _snap(VLLM_AFTER), "m")
    assert w.status == m.OK and w.flavour == "vllm"
    assert (w.drafts, w.draft_tokens, w.accepted) == (50.0, 150.0, 90.0)
    assert w.accepted_per_pos == [50.0, 30.0, 10.0]
    assert w.acceptance_rate == pytest.approx(90 / 150)
    assert w.mean_acceptance_length == pytest.approx(1 + 90 / 50)
    assert w.per_position_rate == pytest.approx([1.0, 0.6, 0.2])


def test_family_names_drop_total_but_sample_names_keep_it() -> None:
    samples = m.parse_exposition(VLLM_BEFORE)
    assert VLLM_METRICS.drafts in samples and "vllm:spec_decode_num_drafts" not in samples
    assert "vllm:spec_decode_num_drafts_created" in samples


# llama-server's /metrics text, in the layout of server-task.cpp's to_metrics(): HELP and TYPE
# lines per counter, no labels except `position`, integer values.
LLAMACPP_TEMPLATE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 24
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {pred}
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 88
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {draft}
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {acc}
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {steps}
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
{per_pos}"""


def _llamacpp(pred: int, draft: int, acc: int, steps: int, per_pos: list[int]) -> str:
    lines = ""
    if per_pos:
        lines = (
            "# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position\n"
            "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        )
        lines += "".join(
            f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}\n'
            for i, v in enumerate(per_pos)
        )
    return LLAMACPP_TEMPLATE.format(pred=pred, draft=draft, acc=acc, steps=steps, per_pos=lines)


def test_llamacpp_window_per_position_series_appear_after_the_first_request() -> None:
    # the counts a 64-token completion gave with the model as its own draft (k = 6)
    before = _snap(_llamacpp(0, 0, 0, 0, []))
    after = _snap(_llamacpp(64, 54, 54, 9, [9] * 6))
    w = m.spec_window(before, after, "SmolLM2")  # llama.cpp has no model_name label: not filtered
    assert w.status == m.OK and w.flavour == "llamacpp"
    assert w.acceptance_rate == 1.0
    assert w.mean_acceptance_length == pytest.approx(7.0)
    assert w.per_position_rate == [1.0] * 6


def test_counter_going_backwards_voids_the_window() -> None:
    w = m.spec_window(_snap(_llamacpp(64, 54, 54, 9, [9] * 6)), _snap(_llamacpp(10, 6, 3, 2, [2, 1])), None)
    assert w.status == m.VOID and "restarted" in w.detail and "drafts_total{} went from 9 to 2" in w.detail
    assert w.acceptance_rate is None and w.mean_acceptance_length is None


def test_restart_that_climbs_back_is_caught_by_created_time() -> None:
    after = VLLM_AFTER.replace("1.7959832182002308e+09", "1.7959839999e+09")
    w = m.spec_window(_snap(VLLM_BEFORE), _snap(after), "m")
    assert w.status == m.VOID and "vllm:spec_decode_num_drafts_created" in w.detail
    start = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1700000000.5\n"
    w = m.spec_window(
        _snap(start + _llamacpp(64, 54, 54, 9, [9] * 6)),
        _snap(start.replace("0.5", "9.5") + _llamacpp(128, 108, 108, 18, [18] * 6)),
        None,
    )
    assert w.status == m.VOID and "process_start_time_seconds" in w.detail


def test_a_series_that_disappears_voids_the_window() -> None:
    w = m.spec_window(_snap(_llamacpp(64, 54, 54, 9, [9, 9])), _snap(_llamacpp(70, 60, 60, 10, [])), None)
    assert w.status == m.VOID


def test_no_drafts_and_no_spec_counters_are_not_zero_acceptance() -> None:
    same = _snap(_llamacpp(64, 0, 0, 0, []))
    w = m.spec_window(same, _snap(_llamacpp(128, 0, 0, 0, [])), None)
    assert w.status == m.NO_DRAFTS and w.acceptance_rate is None
    plain = _snap('# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name="m"} 3\n')
    w = m.spec_window(plain, plain, "m")
    assert w.status == m.NOT_SPECULATING and w.acceptance_rate is None


def test_unknown_model_name_is_unavailable_not_zero() -> None:
    w = m.spec_window(_snap(VLLM_BEFORE), _snap(VLLM_AFTER), "not-served")
    assert w.status == m.UNAVAILABLE and "model_name='not-served'" in w.detail
    assert "m, other" in w.detail


def test_missing_endpoint_raises_unavailable(standin) -> None:
    url = standin(metrics=False)
    with httpx.Client(trust_env=False) as client, pytest.raises(m.MetricsUnavailable, match="HTTP 404"):
        m.scrape(client, url)
    with httpx.Client(trust_env=False) as client, pytest.raises(m.MetricsUnavailable, match="failed"):
        m.scrape(client, "http://127.0.0.1:9")
    assert m.unavailable("x").status == m.UNAVAILABLE


def test_standin_emits_vllm_names_that_move_with_requests(standin) -> None:
    """The stand-in registers the counters as vLLM does; scrapes around requests give exact deltas."""
    from weightsmith.bench import client as cl

    url = standin(k=3, accept_pattern=[3, 1, 2, 0], engines=2)
    with httpx.Client(trust_env=False) as client:
        raw = client.get(url + "/metrics").text
        for name in VLLM_METRICS.counters():
            assert f"# TYPE {name} counter" in raw
            assert f'{name}{{engine="0",model_name="standin/model"' in raw
        before = m.scrape(client, url)
        for _ in range(2):
            body = cl.request_body(
                "completions", "standin/model", "x" * 80, max_tokens=11, temperature=0, ignore_eos=True
            )
            assert cl.stream_request(client, url, "completions", body, 10).error is None
        after = m.settled_scrape(client, url, settle_s=0.05)
    w = m.spec_window(before, after, "standin/model")
    # 11 tokens: 1 from prefill, then steps accepting 3,1,2,0 -> 4+2+3+1 = 10 more: 4 drafts each
    assert (w.drafts, w.draft_tokens, w.accepted) == (8.0, 24.0, 12.0)
    assert w.accepted_per_pos == [6.0, 4.0, 2.0]
    assert w.mean_acceptance_length == pytest.approx(2.5)
