"""One streamed request to an OpenAI-compatible server, timed on the client.

Timing rules, each there because a simpler rule gives a wrong number:

- TTFT ends at the first SSE chunk that carries a token: completion text, chat content, or chat
  reasoning. vLLM opens chat streams with a role-only delta that carries none, and reasoning
  models stream reasoning before content.
- Token counts come from the server's `usage` (requested with `stream_options.include_usage`),
  never from counting chunks: under speculative decoding one chunk carries several tokens.
- Decode rate is (completion_tokens - 1) / (t_last_token - t_first_token): the first token
  belongs to prefill, and the chunks after the last token (finish reason, usage) are not decode.

Every answer is read through `serverio` (a total deadline, a byte cap, JSON without NaN or
Infinity), and a count the server reports must be a whole number from 0 to 2**53: a request whose
answer breaks any of that fails with one line naming the URL (a failed request's timings are never
used).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

import httpx

from weightsmith.bench import serverio
from weightsmith.bench.kinds import tokenize_body
from weightsmith.bench.serverio import MAX_COUNT, ServerReadError
from weightsmith.core.terminal import one_line, short_repr


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
    #: The server did not answer at all (refused, reset, or nothing complete by the deadline): what
    #: counts towards a server that stopped answering. Not part of the request's record.
    unreachable: bool = False

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


class _NotACount(ValueError):
    """A count in a server's answer that is not a whole number from 0 to MAX_COUNT."""


def _count(container: dict[str, Any], key: str, where: str, previous: int | None) -> int | None:
    """`container[key]` as a count (`previous` where it is absent or null), or `_NotACount` naming it:
    a count that is text, fractional, negative or past 2**53 would make every rate from it a guess."""
    value = container.get(key)
    if value is None:
        return previous
    if not _is_count(value):
        raise _NotACount(f"{where}.{key} is not a count (got {short_repr(value)})")
    return value


def _is_count(value: Any) -> TypeGuard[int]:
    """A whole number from 0 to MAX_COUNT, as `_count` requires."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _apply_chunk(chunk: dict[str, Any], outcome: StreamOutcome, now: float) -> None:
    """Fold one parsed SSE chunk into the outcome; the caller has already checked for errors.

    Fields of the wrong type raise TypeError, ValueError or AttributeError, `_NotACount` for a count.
    """
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = _count(usage, "prompt_tokens", "usage", outcome.prompt_tokens)
        outcome.completion_tokens = _count(usage, "completion_tokens", "usage", outcome.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            where = "usage.prompt_tokens_details"
            outcome.cached_tokens = _count(details, "cached_tokens", where, outcome.cached_tokens)
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


#: How much of an error answer's body is read for its message (the line shows 200 characters).
_ERROR_BODY_BYTES = 65536


def _http_error(status: int, raw: str) -> str:
    """The one-line error for an HTTP error status: the server's own message when its body is JSON."""
    try:
        message = _error_text(serverio.loads(raw))
    except ValueError:
        message = raw
    return one_line(f"HTTP {status}: {message}")


def _error_body(answer: serverio.Answer) -> str:
    """The start of an error answer's body, as text: enough for its message, however long it is."""
    body = bytearray()
    for chunk in answer.chunks():
        body += chunk
        if len(body) >= _ERROR_BODY_BYTES:
            break
    return bytes(body[:_ERROR_BODY_BYTES]).decode("utf-8", "replace")


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
    try:
        with serverio.reading(
            client, "POST", url, deadline_s=timeout_s, max_bytes=serverio.MAX_STREAM_BYTES, json_body=body
        ) as answer:
            problem: str | None
            if answer.status >= 400:
                problem = _http_error(answer.status, _error_body(answer))
            else:
                problem = _read_events(answer, outcome, start)
    except ServerReadError as exc:
        outcome.error, outcome.unreachable = str(exc), exc.unreachable
        return outcome
    if problem is None:
        outcome.e2e_s = time.perf_counter() - start
        problem = _missing_counts(outcome)
    if problem is not None:
        outcome.error = f"{url}: {problem}"
    return outcome


def _read_events(answer: serverio.Answer, outcome: StreamOutcome, start: float) -> str | None:
    """Fold the SSE events into `outcome` as they arrive, until `[DONE]` or the end of the stream;
    what is wrong with the stream, if anything.

    vLLM and llama.cpp put one JSON object on one `data:` line: it is parsed as soon as it arrives, so
    that its arrival time is the one recorded. An event spread over several lines is parsed when it
    ends (a blank line), once, so a stream of lines that never parse costs no more than their length.
    """
    pending: list[str] = []  # the data lines of an event that did not parse on its first line
    for line in answer.lines():
        now = time.perf_counter() - start
        if line.startswith("error:"):
            return one_line(f"server error: {line[6:].strip()}")
        if line.startswith("data:"):
            data = line[5:].strip()
            if pending:
                pending.append(data)
                continue
            if data == "[DONE]":
                return None
            if not data:
                continue
            try:
                chunk = serverio.loads(data)
            except ValueError:
                pending.append(data)
                continue
            problem = _fold(chunk, outcome, now)
        elif not line.strip() and pending:
            problem = _fold_text("\n".join(pending), outcome, now)
            pending.clear()
        else:
            continue
        if problem is not None:
            return problem
    return _fold_text("\n".join(pending), outcome, time.perf_counter() - start) if pending else None


def _fold_text(text: str, outcome: StreamOutcome, now: float) -> str | None:
    """`_fold` for an event's whole data, which must be JSON."""
    try:
        chunk = serverio.loads(text)
    except ValueError as exc:
        return one_line(f"an event is not readable JSON ({exc})")
    return _fold(chunk, outcome, now)


def _fold(chunk: Any, outcome: StreamOutcome, now: float) -> str | None:
    """Fold one event's JSON into `outcome`; what is wrong with it (an error the server sent, a count
    that is not one, a field of the wrong type), if anything."""
    if not isinstance(chunk, dict):
        return None
    if "error" in chunk and not chunk.get("choices"):
        return one_line(f"server error: {_error_text(chunk)}")
    try:
        _apply_chunk(chunk, outcome, now)
    except _NotACount as exc:
        return one_line(str(exc))
    except (TypeError, ValueError, AttributeError) as exc:
        return one_line(f"an event is malformed ({type(exc).__name__}: {exc})")
    return None


def _missing_counts(outcome: StreamOutcome) -> str | None:
    """Why a stream that ended well still gives no timing: no usage, or no token chunks."""
    if outcome.completion_tokens is None:
        return (
            "the stream carried no usage (server ignored stream_options.include_usage); "
            "token counts are not guessed from chunks"
        )
    if outcome.ttft_s is None and outcome.completion_tokens > 0:
        return "the stream carried no token chunks"
    return None


def listed_models(reply: serverio.Reply) -> list[str]:
    """The model ids a /v1/models answer lists, or a `ServerReadError` saying what is wrong with it."""
    if reply.status != 200:
        raise ServerReadError(reply.url, f"HTTP {reply.status}")
    try:
        payload = reply.json()
    except ValueError as exc:
        raise ServerReadError(reply.url, one_line(f"not readable JSON ({exc})")) from None
    data = payload.get("data") if isinstance(payload, dict) else None
    listed = data if isinstance(data, list) else []
    ids = [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise ServerReadError(reply.url, "lists no model")
    return ids


def fetch_model_id(client: httpx.Client, base_url: str) -> str:
    """The first model id the server lists at /v1/models (what it serves when given one model);
    a `ServerReadError` when there is none to read."""
    url = base_url.rstrip("/") + "/v1/models"
    reply = serverio.fetch(
        client, "GET", url, deadline_s=serverio.MODELS_DEADLINE_S, max_bytes=serverio.MAX_STATUS_BYTES
    )
    return listed_models(reply)[0]


def count_tokens(client: httpx.Client, base_url: str, model: str, text: str) -> int | None:
    """Tokens in `text` per the server's own tokenizer (`/tokenize`), or None if it has none, or its
    answer is no count (late, too long, not JSON, not a whole number from 0 to 2**53).

    The body carries the text under every kind's field (`kinds.tokenize_body`).
    """
    try:
        reply = serverio.fetch(
            client,
            "POST",
            base_url.rstrip("/") + "/tokenize",
            deadline_s=serverio.TOKENIZE_DEADLINE_S,
            max_bytes=serverio.MAX_ANSWER_BYTES,
            json_body=tokenize_body(model, text),
        )
        data = reply.json() if reply.status == 200 else None
    except (ServerReadError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if _is_count(data.get("count")):
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
        completion_tokens=tokens if _is_count(tokens) else None,
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
    """POST one non-streamed request; failures come back as `error` (one line beginning with the
    URL), never raised.

    `"stream": false` is set here, the one place a whole answer is asked for.
    """
    url = base_url.rstrip("/") + endpoint_path(endpoint)
    try:
        reply = serverio.fetch(
            client,
            "POST",
            url,
            deadline_s=timeout_s,
            max_bytes=serverio.MAX_ANSWER_BYTES,
            json_body={**body, "stream": False},
        )
    except ServerReadError as exc:
        return Answer(error=str(exc))
    if reply.status >= 400:
        return Answer(error=f"{url}: {_http_error(reply.status, reply.text())}")
    try:
        payload = reply.json()
    except ValueError as exc:
        return Answer(error=one_line(f"{url}: the response is not readable JSON ({exc})"))
    answer = answer_from_json(endpoint, payload)
    if answer.error is not None:
        answer.error = f"{url}: {answer.error}"
    return answer
