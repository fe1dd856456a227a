"""Streaming client: TTFT rules, usage-based token counts, logprobs, and failures as one line."""

from __future__ import annotations

import httpx
import pytest

from weightsmith.bench import client as cl

MODEL = "standin/model"


def _run(url: str, endpoint: str = "completions", timeout: float = 10.0, **kwargs) -> cl.StreamOutcome:
    body = cl.request_body(
        endpoint,
        MODEL,
        kwargs.pop("prompt", "def f(x):\n    return x\n" * 4),
        max_tokens=kwargs.pop("max_tokens", 24),
        temperature=0.0,
        ignore_eos=True,
        **kwargs,
    )
    with httpx.Client(trust_env=False) as client:
        return cl.stream_request(client, url, endpoint, body, timeout)


def test_request_body_asks_for_streamed_usage() -> None:
    body = cl.request_body("completions", "m", "p", max_tokens=8, temperature=0.0, ignore_eos=True, top_logprobs=3)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == "p" and body["logprobs"] == 3 and body["ignore_eos"] is True
    chat = cl.request_body(
        "chat", "m", "p", max_tokens=8, temperature=0.0, ignore_eos=False, top_logprobs=2, extra={"seed": 1}
    )
    assert chat["messages"] == [{"role": "user", "content": "p"}]
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2 and chat["seed"] == 1
    assert "ignore_eos" not in chat


def test_tokens_come_from_usage_not_from_chunks(standin) -> None:
    # every verification step accepts all 3 drafts: 4 tokens per SSE chunk
    url = standin(k=3, accept_pattern=[3], ttft_s=0.05, step_s=0.01)
    out = _run(url, max_tokens=25)
    assert out.error is None
    assert out.completion_tokens == 25
    assert out.token_chunks == 7  # 1 + 6 steps of 4 tokens
    assert out.prompt_tokens is not None and out.prompt_tokens > 0
    assert out.ttft_s is not None and out.ttft_s >= 0.05
    # 24 tokens decoded after the first, from usage: counting chunks would have claimed 6
    assert out.decode_tok_s == pytest.approx(24 / (out.last_token_s - out.ttft_s))
    assert out.e2e_s is not None and out.e2e_s >= out.last_token_s
    assert out.finish_reason == "length"


def test_chat_role_only_first_delta_does_not_end_ttft(standin) -> None:
    url = standin(k=0, ttft_s=0.15, step_s=0.002)
    out = _run(url, "chat")
    assert out.error is None
    assert out.ttft_s is not None and out.ttft_s >= 0.15
    assert out.content.strip().startswith("t")


def test_reasoning_before_content_counts_as_the_first_token(standin) -> None:
    step_s = 0.5  # long steps: a loaded machine's scheduling delay cannot pass for the gap below
    url = standin(k=0, ttft_s=0.05, step_s=step_s, reasoning_tokens=3)
    out = _run(url, "chat", max_tokens=5)
    assert out.error is None
    assert out.reasoning and out.content
    # the first chunk is reasoning and arrives at ~ttft; content only starts three steps later
    assert 0.05 <= out.ttft_s < 0.05 + 3 * step_s


def test_missing_usage_is_an_error_not_a_guess(standin) -> None:
    url = standin(honour_include_usage=False)
    out = _run(url)
    assert out.error is not None and "usage" in out.error
    assert out.completion_tokens is None and out.decode_tok_s is None


def test_http_error_is_one_line(standin) -> None:
    url = standin(reject_marker="REJECT")
    out = _run(url, prompt="REJECT this")
    assert out.error == f"{url}/v1/completions: HTTP 400: stand-in rejects this prompt"


def test_timeout_and_refused_connection(standin) -> None:
    url = standin(ttft_s=3.0)
    out = _run(url, timeout=0.5)
    assert out.error == f"{url}/v1/completions: no complete answer within 0.5 s" and out.unreachable
    out = _run("http://127.0.0.1:9")
    assert out.error is not None and out.error.startswith("http://127.0.0.1:9/v1/completions: connection failed")
    assert "\n" not in out.error and out.unreachable


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_logprobs_in_both_layouts(standin, endpoint: str) -> None:
    url = standin(k=3, accept_pattern=[2])
    out = _run(url, endpoint, max_tokens=10, top_logprobs=2)
    assert out.error is None
    assert len(out.positions) == 10
    first = out.positions[0]
    assert first.logprob is not None and first.token in first.top and len(first.top) == 2
    again = _run(url, endpoint, max_tokens=10, top_logprobs=2)
    assert [p.logprob for p in again.positions] == [p.logprob for p in out.positions]


def test_llamacpp_completion_chunk_with_logprobs_content() -> None:
    """llama-server streams /v1/completions logprobs in the chat layout, with token ids."""
    outcome = cl.StreamOutcome()
    chunk = {
        "choices": [
            {
                "text": " return",
                "index": 0,
                "finish_reason": None,
                "logprobs": {
                    "content": [
                        {
                            "id": 471,
                            "token": " return",
                            "bytes": [32],
                            "logprob": -0.25,
                            "top_logprobs": [
                                {"id": 471, "token": " return", "bytes": [32], "logprob": -0.25},
                                {"id": 9, "token": " pass", "bytes": [32], "logprob": -1.75},
                            ],
                        }
                    ]
                },
            }
        ],
        "object": "text_completion",
    }
    cl._apply_chunk(chunk, outcome, 0.5)
    final = {
        "choices": [{"text": "", "index": 0, "finish_reason": "length", "logprobs": None}],
        "usage": {"completion_tokens": 1, "prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}},
    }
    cl._apply_chunk(final, outcome, 0.7)
    assert outcome.ttft_s == 0.5 and outcome.last_token_s == 0.5  # the final chunk carries no token
    assert outcome.positions[0].token_id == 471
    assert outcome.positions[0].top == {" return": -0.25, " pass": -1.75}
    assert (outcome.completion_tokens, outcome.prompt_tokens, outcome.cached_tokens) == (1, 7, 3)
    assert outcome.finish_reason == "length"


def test_model_id_and_tokenizer(standin) -> None:
    url = standin()
    with httpx.Client(trust_env=False) as client:
        assert cl.fetch_model_id(client, url) == MODEL
        assert cl.count_tokens(client, url, MODEL, "x" * 40) == 10
        assert cl.count_tokens(client, "http://127.0.0.1:9", MODEL, "x") is None


def _answer_from(status: int, text: str) -> cl.Answer:
    """`complete` against a stand-in that answers every POST with `text`; records the body it was sent."""
    sent: list[bytes] = []

    def reply(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(status, text=text)

    with httpx.Client(transport=httpx.MockTransport(reply)) as client:
        answer = cl.complete(client, "http://standin", "completions", {"model": MODEL, "stream": True}, 5.0)
    assert b'"stream":false' in sent[0].replace(b" ", b"")
    return answer


def test_deeply_nested_answer_is_one_line_naming_the_url() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    answer = _answer_from(200, deep)
    assert answer.error is not None and "\n" not in answer.error
    assert answer.error.startswith("http://standin/v1/completions: the response is not readable JSON")
    assert "nested too deeply" in answer.error
    error = _answer_from(500, deep).error
    prefix = "http://standin/v1/completions: "
    assert error is not None and error.startswith(prefix + "HTTP 500: [[[") and len(error) <= len(prefix) + 200


def test_http_error_of_a_whole_answer_names_the_servers_message() -> None:
    error = _answer_from(400, '{"error": {"message": "bad\\nprompt"}}').error
    assert error == "http://standin/v1/completions: HTTP 400: bad prompt"
    assert _answer_from(200, '{"choices": [{"text": "hi"}]}').content == "hi"
