"""One streamed request to an OpenAI-compatible server, timed on the client.

Timing rules, each there because a simpler rule gives a wrong number:

- TTFT ends at the first SSE chunk that carries a token: completion text, chat content, or chat
  reasoning. vLLM opens chat streams with a role-only delta that carries none, and reasoning
  models stream reasoning before content.
- Token counts come from the server's `usage` (requested with `stream_options.include_usage`),
  never from counting chunks: under speculative decoding one chunk carries several tokens.
- Decode rate is (completion_tokens - 1) / (t_last_token - t_first_token): the first token
  belongs to prefill, and the chunks after the last token (finish reason, usage) are not decode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from weightsmith.bench.kinds import tokenize_body


@dataclass
class TokenLogprob:
    """One generated position: the chosen token, its logprob, and the top-k alternatives."""

    token: str
    logprob: float | None
    top: dict[str, float] = field(default_factory=dict)
    token_id: int | None = None


@dataclass(kw_only=True)
class RequestTiming:
    """How one request went, timed on the client: the fields a run record keeps of a request."""

    error: str | None = None
    ttft_s: float | None = None
    #: Tokens after the first over the time between the first and last token chunks.
    decode_tok_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    token_chunks: int = 0
    finish_reason: str | None = None

    def timing(self) -> dict[str, Any]:
        """The timing fields alone, to build another record from (`RequestRecord`)."""
        return {f.name: getattr(self, f.name) for f in fields(RequestTiming)}


@dataclass(kw_only=True)
class StreamOutcome(RequestTiming):
    """What one streamed request produced, with times in seconds from just before the POST."""

    last_token_s: float | None = None
    content: str = ""
    reasoning: str = ""
    positions: list[TokenLogprob] = field(default_factory=list)

    def decode_rate(self) -> float | None:
        """`decode_tok_s` from the token counts and chunk times so far (None below two tokens)."""
        if (
            self.completion_tokens is None
            or self.completion_tokens < 2
            or self.ttft_s is None
            or self.last_token_s is None
            or self.last_token_s <= self.ttft_s
        ):
            return None
        return (self.completion_tokens - 1) / (self.last_token_s - self.ttft_s)


def request_body(
    endpoint: str,
    model: str,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float,
    ignore_eos: bool,
    top_logprobs: int = 0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body for `/v1/completions` or `/v1/chat/completions`, streamed with usage."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
    else:
        body["prompt"] = prompt
        if top_logprobs:
            body["logprobs"] = top_logprobs
    body.update(extra or {})
    return body


def endpoint_path(endpoint: str) -> str:
    """URL path of the OpenAI endpoint named in the workload."""
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _positions_from_logprobs(logprobs: Any) -> list[TokenLogprob]:
    """Both logprob layouts: OpenAI chat's `content` list (also llama.cpp's completions) and the
    legacy completions arrays (`tokens`, `token_logprobs`, `top_logprobs`) that vLLM sends."""
    if not isinstance(logprobs, dict):
        return []
    out: list[TokenLogprob] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                continue
            top = {}
            for alt in item.get("top_logprobs") or []:
                if isinstance(alt, dict) and "token" in alt and alt.get("logprob") is not None:
                    top[str(alt["token"])] = float(alt["logprob"])
            lp = item.get("logprob")
            out.append(
                TokenLogprob(
                    token=str(item.get("token", "")),
                    logprob=None if lp is None else float(lp),
                    top=top,
                    token_id=item.get("id"),
                )
            )
        return out
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list):
        lps = logprobs.get("token_logprobs") or [None] * len(tokens)
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        for tok, lp, top in zip(tokens, lps, tops, strict=False):
            out.append(
                TokenLogprob(
                    token=str(tok),
                    logprob=None if lp is None else float(lp),
                    top={str(k): float(v) for k, v in (top or {}).items() if v is not None},
                )
            )
    return out


def _apply_chunk(chunk: dict[str, Any], outcome: StreamOutcome, now: float) -> None:
    """Fold one parsed SSE chunk into the outcome; the caller has already checked for errors."""
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = usage.get("prompt_tokens", outcome.prompt_tokens)
        outcome.completion_tokens = usage.get("completion_tokens", outcome.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            outcome.cached_tokens = details["cached_tokens"]
    carried = False
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            outcome.finish_reason = choice["finish_reason"]
        positions = _positions_from_logprobs(choice.get("logprobs"))
        outcome.positions.extend(positions)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            outcome.content += content
            outcome.reasoning += reasoning
            carried = carried or bool(content or reasoning or delta.get("tool_calls"))
        else:
            text = choice.get("text") or ""
            outcome.content += text
            carried = carried or bool(text)
        carried = carried or bool(positions)
    if carried:
        outcome.token_chunks += 1
        if outcome.ttft_s is None:
            outcome.ttft_s = now
        outcome.last_token_s = now


def _error_text(payload: Any) -> str:
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(payload)


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _loads(text: str) -> Any:
    """`json.loads`, with a body nested too deeply for the parser raised as a ValueError like any bad JSON.

    A server's bytes are not trusted: `json.loads` raises RecursionError on deep nesting, which would
    otherwise escape the "failures come back as `error`" promise as a traceback.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None


def _http_error(status: int, raw: str) -> str:
    """The one-line error for an HTTP error status: the server's own message when its body is JSON."""
    try:
        message = _error_text(_loads(raw))
    except ValueError:
        message = raw
    return _one_line(f"HTTP {status}: {message}")


def stream_request(
    client: httpx.Client,
    base_url: str,
    endpoint: str,
    body: dict[str, Any],
    timeout_s: float,
) -> StreamOutcome:
    """POST one streaming request and time it; failures come back as `error`, never raised."""
    outcome = _stream(client, base_url, endpoint, body, timeout_s)
    outcome.decode_tok_s = outcome.decode_rate()  # once, from the last chunk's time, however the stream ended
    return outcome


def _stream(
    client: httpx.Client, base_url: str, endpoint: str, body: dict[str, Any], timeout_s: float
) -> StreamOutcome:
    outcome = StreamOutcome()
    url = base_url.rstrip("/") + endpoint_path(endpoint)
    start = time.perf_counter()
    deadline = start + timeout_s
    try:
        with client.stream("POST", url, json=body, timeout=httpx.Timeout(timeout_s, connect=10.0)) as r:
            if r.status_code >= 400:
                outcome.error = _http_error(r.status_code, r.read().decode("utf-8", "replace"))
                return outcome
            data_lines: list[str] = []
            for line in r.iter_lines():
                now = time.perf_counter() - start
                if now + start > deadline:
                    outcome.error = f"timed out after {timeout_s:g} s (stream still open)"
                    return outcome
                if line.startswith("data:"):
                    data_lines.append(line[5:].strip())
                    # vLLM and llama.cpp put one JSON object on one line: parse it right away so
                    # its arrival time is the one recorded.
                    payload = "\n".join(data_lines)
                    if payload == "[DONE]":
                        data_lines.clear()
                        break
                    try:
                        chunk = _loads(payload)
                    except ValueError:
                        continue
                    data_lines.clear()
                    if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
                        outcome.error = _one_line(f"server error: {_error_text(chunk)}")
                        return outcome
                    if isinstance(chunk, dict):
                        _apply_chunk(chunk, outcome, now)
                elif line.startswith("error:"):
                    outcome.error = _one_line(f"server error: {line[6:].strip()}")
                    return outcome
            outcome.e2e_s = time.perf_counter() - start
    except httpx.TimeoutException:
        outcome.error = f"timed out after {timeout_s:g} s"
        return outcome
    except httpx.TransportError as exc:
        outcome.error = _one_line(f"connection failed: {type(exc).__name__}: {exc}")
        return outcome
    if outcome.completion_tokens is None:
        outcome.error = (
            "the stream carried no usage (server ignored stream_options.include_usage); "
            "token counts are not guessed from chunks"
        )
    elif outcome.ttft_s is None and outcome.completion_tokens > 0:
        outcome.error = "the stream carried no token chunks"
    return outcome


def fetch_model_id(client: httpx.Client, base_url: str) -> str:
    """The first model id the server lists at /v1/models (what it serves when given one model)."""
    r = client.get(base_url.rstrip("/") + "/v1/models", timeout=10.0)
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data or "id" not in data[0]:
        raise ValueError("/v1/models lists no model")
    return str(data[0]["id"])


def count_tokens(client: httpx.Client, base_url: str, model: str, text: str) -> int | None:
    """Tokens in `text` per the server's own tokenizer (`/tokenize`), or None if it has none.

    The body carries the text under every kind's field (`kinds.tokenize_body`).
    """
    try:
        r = client.post(base_url.rstrip("/") + "/tokenize", json=tokenize_body(model, text), timeout=30.0)
        if r.status_code != 200:
            return None
        data = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    if isinstance(data.get("count"), int):
        return int(data["count"])
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) and tokens else None


@dataclass
class ToolCall:
    """One tool call as the server returned it: `arguments` is the JSON text, unparsed."""

    name: str
    arguments: str


@dataclass
class Answer:
    """A whole (not streamed) completion: what quality scenarios are judged on."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


def _tool_calls(message: dict[str, Any]) -> list[ToolCall] | str:
    """`message.tool_calls` in the OpenAI wire format (vLLM's and llama.cpp's), or what is wrong."""
    raw = message.get("tool_calls")
    if raw is None:
        return []
    if not isinstance(raw, list):
        return "tool_calls is not a list"
    calls = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tool_calls[{i}] has no function name"
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send an object, not the text the spec names
            arguments = json.dumps(arguments)
        if not isinstance(arguments, str):
            return f"tool_calls[{i}].function.arguments is not a string"
        calls.append(ToolCall(function["name"], arguments))
    return calls


def answer_from_json(endpoint: str, payload: Any) -> Answer:
    """The answer in a non-streamed response body: `choices[0].text` (completions) or
    `choices[0].message.{content, tool_calls}` (chat), with `usage.completion_tokens`."""
    if not isinstance(payload, dict):
        return Answer(error="the response is not a JSON object")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Answer(error="the response has no choices")
    choice = choices[0]
    usage = payload.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    answer = Answer(
        completion_tokens=tokens if isinstance(tokens, int) else None,
        finish_reason=choice.get("finish_reason"),
    )
    if endpoint == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            answer.error = "choices[0] has no message"
            return answer
        answer.content = message.get("content") or ""
        calls = _tool_calls(message)
        if isinstance(calls, str):
            answer.error = calls
        else:
            answer.tool_calls = calls
    else:
        answer.content = choice.get("text") or ""
    if not isinstance(answer.content, str):
        answer.content, answer.error = "", "the answer's text is not a string"
    return answer


def complete(client: httpx.Client, base_url: str, endpoint: str, body: dict[str, Any], timeout_s: float) -> Answer:
    """POST one non-streamed request; failures come back as `error`, never raised.

    `"stream": false` is set here, the one place a whole answer is asked for.
    """
    url = base_url.rstrip("/") + endpoint_path(endpoint)
    try:
        r = client.post(url, json={**body, "stream": False}, timeout=httpx.Timeout(timeout_s, connect=10.0))
    except httpx.TimeoutException:
        return Answer(error=f"timed out after {timeout_s:g} s")
    except httpx.TransportError as exc:
        return Answer(error=_one_line(f"connection failed: {type(exc).__name__}: {exc}"))
    if r.status_code >= 400:
        return Answer(error=_http_error(r.status_code, r.text))
    try:
        payload = _loads(r.text)
    except ValueError as exc:
        return Answer(error=_one_line(f"{url}: the response is not readable JSON ({exc})"))
    return answer_from_json(endpoint, payload)
