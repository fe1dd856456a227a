"""Every HTTP read bench makes of a server, each with a total deadline and a byte cap.

A server under test is not trusted to answer well. One that sends a byte every few seconds keeps
httpx's read timeout, which restarts with every byte, from ever firing; one whose body never ends
fills memory. So every read (a completion, streamed or whole, `/metrics`, `/health`, `/v1/models`,
`/tokenize`) goes through `fetch` or `reading`, which:

- end at a deadline on the wall clock, counted from the start of the request. Every socket
  operation of a client made by `new_client` waits at most for the time left (`_DeadlineBackend`),
  so neither a dripping status line nor a dripping body can stretch it; the time is also checked
  between chunks, which is all a client made elsewhere (a test's mock transport) gets;
- stop reading once the answer passes its cap, counted on the decoded bytes (a compressed body is
  counted inflated);
- fail as `ServerReadError`, whose text is one line naming the URL and what happened:
  `http://127.0.0.1:8000/metrics: no complete answer within 10 s`, `...: answer exceeds 16 MiB`.

JSON from a server is read by `loads`: NaN, Infinity and numbers beyond a float's range are refused,
as is nesting deeper than the parser can follow, so no non-number reaches a result or a report.
"""

from __future__ import annotations

import codecs
import json
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from weightsmith.core.terminal import one_line

MiB = 1 << 20

#: The largest count taken from a server (a usage count, a counter's value): every whole number up to
#: it is exact in a float, so past it (or a server lying about it) deltas and sums would be guesses.
MAX_COUNT = 2**53

#: /metrics: a real vLLM's is some hundreds of KB (histograms per model and engine); 16 MiB leaves
#: room for many served models and adapters.
MAX_METRICS_BYTES = 16 * MiB
#: /health and /v1/models: a few hundred bytes; a list of hundreds of adapters stays far below 4 MiB.
MAX_STATUS_BYTES = 4 * MiB
#: A whole (not streamed) completion, and /tokenize's answer: up to 1,048,576 tokens (the arms
#: file's bound on `max_tokens` and on prompt lengths) as text or as a JSON list of ids, a few to
#: about ten bytes each.
MAX_ANSWER_BYTES = 64 * MiB
#: A streamed completion: an SSE event per token or per speculative step, 200 to 400 bytes each from
#: vLLM and llama.cpp (more with top logprobs); 256 MiB holds about a million of them.
MAX_STREAM_BYTES = 256 * MiB

#: One /metrics scrape: vLLM and llama.cpp answer in milliseconds, a busy server within a second.
METRICS_DEADLINE_S = 10.0
#: One /health or /v1/models poll while a server starts; polling goes on until the arm's
#: `startup_timeout_s`, and no poll outlasts what is left of it.
STATUS_DEADLINE_S = 5.0
#: Reading the served model's id from /v1/models once the server is up.
MODELS_DEADLINE_S = 10.0
#: One /tokenize call while the prompts are cut (a real tokenizer takes seconds on a 1M-token prompt).
TOKENIZE_DEADLINE_S = 30.0
#: Connecting, within any deadline: a server on this machine or its network accepts in milliseconds.
CONNECT_S = 10.0

#: httpx's own connection limits (`httpx.Client()` without arguments).
_LIMITS = {"max_connections": 100, "max_keepalive_connections": 20, "keepalive_expiry": 5.0}

#: When the read under way in this thread must be over (`time.monotonic()`), or None outside `reading`.
_DEADLINE: ContextVar[float | None] = ContextVar("weightsmith_bench_read_deadline", default=None)


class ServerReadError(Exception):
    """A read that gave no usable answer; `str()` is the one line to show: `URL: what happened`.

    `unreachable` is set when the server did not answer at all (refused, reset, or no complete answer
    in time): what the runner counts towards a server that stopped answering.
    """

    def __init__(self, url: str, what: str, *, unreachable: bool = False, timed_out: bool = False) -> None:
        super().__init__(f"{url}: {what}")
        self.unreachable = unreachable
        self.timed_out = timed_out


def size_text(n: int) -> str:
    """A byte count as the caps are written: `16 MiB`, `64 KiB`, or bytes."""
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    if n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} bytes"


#: Said of NaN, Infinity and `1e400` in a server's JSON, in words a report can show.
NOT_FINITE = "a value is not a finite number"


def _refuse_constant(name: str) -> Any:
    raise ValueError(NOT_FINITE)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # `1e400`: beyond a float's range
        raise ValueError(NOT_FINITE)
    return value


def loads(text: str) -> Any:
    """A server's JSON: NaN, Infinity and numbers beyond a float's range are refused, and nesting too
    deep for the parser is a ValueError like any bad JSON (it would otherwise be a RecursionError)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout`, cut to what is left of this thread's read deadline; `error` once none is left."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the read's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every read and write waits at most for the time left."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read as httpcore does, for no longer than the deadline allows."""
        return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Write as httpcore does, for no longer than the deadline allows."""
        self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        """Close the socket."""
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        """TLS for an https arm, its handshake within the deadline too."""
        inner = self._inner.start_tls(ssl_context, server_hostname, _time_left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a socket (is it still readable, its addresses)."""
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own synchronous backend, its streams and connects held to the read's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """Connect within the deadline; the stream keeps to it."""
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        """Connect within the deadline; the stream keeps to it."""
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        """Wait as httpcore's backend does."""
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on a connection pool with `_DeadlineBackend`: httpx takes no network
    backend, so the pool it made is replaced by one like it (httpx's limits, no proxy) that has ours."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=_DeadlineBackend(),
            **_LIMITS,  # type: ignore[arg-type]
        )


def new_client() -> httpx.Client:
    """The client a run reads its servers with: no proxy from the environment (the servers are the
    ones named), and every socket wait held to the deadline of the read under way."""
    return httpx.Client(transport=_DeadlineTransport(), trust_env=False)


class Answer:
    """A server's answer being read within `reading`: its status and headers at once, its body on
    demand, never past the cap or the deadline."""

    def __init__(self, response: httpx.Response, url: str, deadline: float, deadline_s: float, max_bytes: int) -> None:
        self.response = response
        self.url = url
        self._deadline = deadline
        self._deadline_s = deadline_s
        self._max_bytes = max_bytes

    @property
    def status(self) -> int:
        """The HTTP status code."""
        return self.response.status_code

    def check_time(self) -> None:
        """Raise `_timed_out` once the deadline has passed."""
        if time.monotonic() > self._deadline:
            raise _timed_out(self.url, self._deadline_s)

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives, decoded; a declared or received length past the cap is an error
        before the bytes beyond it are kept."""
        too_large = ServerReadError(self.url, f"answer exceeds {size_text(self._max_bytes)}")
        try:
            declared = int(self.response.headers.get("content-length") or 0)
        except ValueError:
            declared = 0
        if declared > self._max_bytes:
            raise too_large
        received = 0
        for chunk in self.response.iter_bytes():
            received += len(chunk)
            if received > self._max_bytes:
                raise too_large
            self.check_time()
            yield chunk

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.chunks())

    def lines(self) -> Iterator[str]:
        """The body's lines as they arrive (UTF-8, bad bytes replaced; `\\n` or `\\r\\n` ends one).

        A line is kept in pieces until it ends, so a body without a newline costs its length in
        memory (bounded by the cap), not its length squared in copying.
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: list[str] = []
        for chunk in self.chunks():
            *ended, rest = decoder.decode(chunk).split("\n")
            if ended:
                ended[0] = "".join([*pending, ended[0]])
                pending = []
                for line in ended:
                    yield line.removesuffix("\r")
            if rest:
                pending.append(rest)
        tail = "".join(pending) + decoder.decode(b"", final=True)
        if tail:
            yield tail.removesuffix("\r")


def _timed_out(url: str, deadline_s: float) -> ServerReadError:
    """The error for an answer not complete by its deadline: the server counts as not answering."""
    return ServerReadError(url, f"no complete answer within {deadline_s:g} s", unreachable=True, timed_out=True)


@contextmanager
def reading(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    json_body: Any = None,
) -> Iterator[Answer]:
    """Send one request and hold its answer open for reading, all within `deadline_s` seconds from
    now and `max_bytes` of body; any failure of the transport is a `ServerReadError`."""
    deadline = time.monotonic() + deadline_s
    token = _DEADLINE.set(deadline)
    timeout = httpx.Timeout(deadline_s, connect=min(CONNECT_S, deadline_s))
    try:
        with client.stream(method, url, json=json_body, timeout=timeout) as response:
            yield Answer(response, url, deadline, deadline_s, max_bytes)
    except httpx.TimeoutException:
        raise _timed_out(url, deadline_s) from None
    except httpx.TransportError as exc:
        what = one_line(f"connection failed: {type(exc).__name__}: {exc}")
        raise ServerReadError(url, what, unreachable=True) from None
    except httpx.HTTPError as exc:  # a body that does not decode (bad gzip), a malformed URL
        raise ServerReadError(url, one_line(f"unreadable answer: {type(exc).__name__}: {exc}")) from None
    finally:
        _DEADLINE.reset(token)


@dataclass(frozen=True)
class Reply:
    """A whole answer: its status and body."""

    url: str
    status: int
    body: bytes

    def text(self) -> str:
        """The body as text (UTF-8, bad bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON (`loads`); a ValueError when it is not."""
        return loads(self.text())


def fetch(
    client: httpx.Client, method: str, url: str, *, deadline_s: float, max_bytes: int, json_body: Any = None
) -> Reply:
    """One whole answer within the deadline and the cap, or a `ServerReadError`."""
    with reading(client, method, url, deadline_s=deadline_s, max_bytes=max_bytes, json_body=json_body) as answer:
        return Reply(url, answer.status, answer.read())
