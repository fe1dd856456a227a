"""Servers that lie to `weightsmith bench`: answers that drip, never end, or carry counters that are not counts.

Every read from a server (a completion, streamed or whole, `/metrics`, `/health`, `/v1/models`,
`/tokenize`) ends within its deadline and its byte cap, as one line naming the URL and what happened;
a drip of one byte at a time cannot stretch the deadline, because every socket read waits at most
for the time left. A counter that is not a finite count, or that goes backwards, is named with the
server's URL and its window is left out of the acceptance figures; report.md never shows `nan` or `inf`.

The liar below is a real HTTP server on a loopback port, in a thread of the test process.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hostile.harness import Sandbox, run_limited, run_subprocess
from weightsmith.bench import client as cl
from weightsmith.bench import metrics as m
from weightsmith.bench import serverio, servers
from weightsmith.bench.analysis import analyse
from weightsmith.bench.config import ArmSpec, parse_config
from weightsmith.bench.report import write_all
from weightsmith.bench.results import BenchResults, VisitResult
from weightsmith.bench.runner import run_bench
from weightsmith.bench.serverio import new_client

MODEL = "liar/model"
#: What one completion adds to the liar's spec-decode counters (2 drafts of 3, 3 accepted).
PER_COMPLETION = {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 3}
PER_POSITION = (2, 1, 0)
#: Seconds between two bytes of a dripping answer: short enough that a read timeout restarted by
#: every byte would never fire.
DRIP_S = 0.25
#: The deadline the drip tests give every read; the drip must not stretch it.
DEADLINE_S = 1.0
#: Longest a bounded call may take on a busy machine before the test calls it a hang.
HANG_S = 10.0
NON_NUMBER = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)


@dataclass
class Behaviour:
    """How the liar answers: per path, `ok`, `drip` (headers, then the body one byte at a time,
    never ending), `drip-headers` (the status line itself one byte at a time) or `endless` (a body
    that never ends, about 13 MB/s). `lie` changes the /metrics counters it reports
    (given how many completions it served); `usage` is the streamed usage object's JSON text."""

    modes: dict[str, str] = field(default_factory=dict)
    drip_s: float = DRIP_S
    lie: Callable[[int], dict[str, str]] | None = None
    usage: str | None = None


def _exposition(served: int, lie: Callable[[int], dict[str, str]] | None) -> str:
    """vLLM's four spec-decode counters after `served` completions, one engine, with `lie` applied
    (sample name, or `position=N`, to the text of its value)."""
    values = {name: f"{served * n}.0" for name, n in PER_COMPLETION.items()}
    values |= {f"position={p}": f"{served * n}.0" for p, n in enumerate(PER_POSITION)}
    values.update(lie(served) if lie else {})
    labels = f'engine="0",model_name="{MODEL}"'
    lines = []
    for name in PER_COMPLETION:
        full = f"vllm:spec_decode_num_{name}_total"
        lines += [f"# TYPE {full} counter", f"{full}{{{labels}}} {values[name]}"]
    full = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines.append(f"# TYPE {full} counter")
    for key, value in values.items():
        if key.startswith("position="):
            lines.append(f'{full}{{{labels},position="{key.split("=", 1)[1]}"}} {value}')
    return "\n".join(lines) + "\n"


def _sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


#: A body that repeats forever, per path: each is valid for as long as it runs.
ENDLESS = {
    "/metrics": (b"", b"# HELP x an endless help text\n"),
    "/health": (b"", b"ok "),
    "/v1/models": (b'{"data": [', b'{"id": "m"}, '),
    "/tokenize": (b'{"tokens": [', b"1, "),
    "/v1/completions": (b"", _sse({"choices": [{"index": 0, "text": " a", "finish_reason": None}]})),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Liar

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self._answer({})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._answer(json.loads(self.rfile.read(length) or b"{}"))

    def _answer(self, body: dict[str, Any]) -> None:
        mode = self.server.behaviour.modes.get(self.path, "ok")
        self.close_connection = True
        try:
            if mode == "endless":
                self._endless()
            elif mode == "drip-headers":
                self._drip(b"HTTP/1.1 200 OK\r\n")
            else:
                status, content_type, payload = self.server.reply(self.path, body)
                if mode == "drip":
                    self._head(status, content_type)
                    self._drip(payload)
                else:
                    self._head(status, content_type, len(payload))
                    self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what the tests want

    def _head(self, status: int, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def _drip(self, payload: bytes) -> None:
        """`payload`, then spaces, one byte at a time, until the client leaves or the test ends."""
        stream = iter(payload)
        while not self.server.stop.is_set():
            self.wfile.write(bytes([next(stream, 0x20)]))
            self.wfile.flush()
            self.server.stop.wait(self.server.behaviour.drip_s)

    def _endless(self) -> None:
        head, piece = ENDLESS.get(self.path, (b"", b"x"))
        self._head(200, "text/plain")
        self.wfile.write(head)
        block = piece * (65536 // len(piece) + 1)
        while not self.server.stop.is_set():
            self.wfile.write(block)
            time.sleep(0.005)  # about 13 MB/s: a client without a cap fills memory, slowly enough to be caught


class _Liar(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.served = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def reply(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        """(status, content type, body) of an honest answer, but for the counters' lie."""
        if path == "/health":
            return 200, "text/plain", b""
        if path == "/v1/models":
            return 200, "application/json", json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
        if path == "/tokenize":
            return 200, "application/json", json.dumps({"count": max(1, len(body.get("prompt", "")) // 4)}).encode()
        if path == "/metrics":
            with self.lock:
                served = self.served
            return 200, "text/plain; version=0.0.4", _exposition(served, self.behaviour.lie).encode()
        if path == "/v1/completions":
            with self.lock:
                self.served += 1
            n = int(body.get("max_tokens", 4))
            usage = self.behaviour.usage or json.dumps({"prompt_tokens": 5, "completion_tokens": n})
            if not body.get("stream"):
                whole = {"choices": [{"index": 0, "text": " a" * n, "finish_reason": "length"}]}
                return 200, "application/json", json.dumps(whole).encode()[:-1] + f', "usage": {usage}}}'.encode()
            chunks = [_sse({"choices": [{"index": 0, "text": " a", "finish_reason": None}]}) for _ in range(n)]
            chunks.append(f'data: {{"choices": [], "usage": {usage}}}\n\n'.encode())
            return 200, "text/event-stream", b"".join(chunks) + b"data: [DONE]\n\n"
        return 404, "application/json", b'{"detail": "Not Found"}'


@pytest.fixture
def liar() -> Iterator[Callable[..., _Liar]]:
    """Start liars on demand (`liar(Behaviour(...))`); all stopped afterwards, dripping handlers too."""
    started: list[_Liar] = []

    def start(behaviour: Behaviour) -> _Liar:
        server = _Liar(behaviour)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _bounded(call: Callable[[], Any]) -> tuple[Any, float]:
    """(what `call` returned or raised, seconds it took), failing the test if it is still running
    after HANG_S: the call runs in a thread, so a read that never ends fails instead of stalling."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except Exception as exc:
            box["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"still reading from the server after {HANG_S:g} s"
    return box["value"], time.monotonic() - start


def _stream_body() -> dict[str, Any]:
    return cl.request_body("completions", MODEL, "x", max_tokens=4, temperature=0.0, ignore_eos=True)


def _url_arm(url: str) -> ArmSpec:
    config = parse_config({"repeats": 1, "arms": [{"name": "liar", "url": url, "model": MODEL}]})
    return config.arms[0]


#: Each read bench makes of a server: (path the liar misbehaves on, the read, the names of its
#: deadline, "" where the caller passes one, and of its byte cap in `serverio`).
READS: dict[str, tuple[str, Callable[[str], Any], str, str]] = {
    "metrics": ("/metrics", lambda url: m.settled_scrape(new_client(), url), "METRICS_DEADLINE_S", "MAX_METRICS_BYTES"),
    "health": (
        "/health",
        lambda url: servers.start_server(_url_arm(url), new_client(), Path("."), "unused.log", None),
        "STATUS_DEADLINE_S",
        "MAX_STATUS_BYTES",
    ),
    "models": (
        "/v1/models",
        lambda url: servers.start_server(_url_arm(url), new_client(), Path("."), "unused.log", None),
        "STATUS_DEADLINE_S",
        "MAX_STATUS_BYTES",
    ),
    "model-id": (
        "/v1/models",
        lambda url: cl.fetch_model_id(new_client(), url),
        "MODELS_DEADLINE_S",
        "MAX_STATUS_BYTES",
    ),
    "tokenize": (
        "/tokenize",
        lambda url: cl.count_tokens(new_client(), url, MODEL, "x" * 40),
        "TOKENIZE_DEADLINE_S",
        "MAX_ANSWER_BYTES",
    ),
    "stream": (
        "/v1/completions",
        lambda url: cl.stream_request(new_client(), url, "completions", _stream_body(), DEADLINE_S),
        "",
        "MAX_STREAM_BYTES",
    ),
    "whole": (
        "/v1/completions",
        lambda url: cl.complete(new_client(), url, "completions", {"model": MODEL, "max_tokens": 4}, DEADLINE_S),
        "",
        "MAX_ANSWER_BYTES",
    ),
}


def _failure(value: Any) -> str:
    """The one line a read ended with: its error, or the message of what it raised."""
    if isinstance(value, Exception):
        return str(value)
    error = getattr(value, "error", None)
    assert isinstance(error, str), f"the read did not fail: {value!r}"
    return error


def _limit(monkeypatch: pytest.MonkeyPatch, name: str, value: float) -> None:
    if name:
        monkeypatch.setattr(serverio, name, value)


@pytest.mark.parametrize("mode", ["drip", "drip-headers"])
@pytest.mark.parametrize("read", list(READS))
def test_a_dripping_answer_ends_at_its_deadline(liar, monkeypatch, read: str, mode: str) -> None:
    path, call, deadline_name, _ = READS[read]
    modes = {path: mode}
    server = liar(Behaviour(modes=modes))
    _limit(monkeypatch, deadline_name, DEADLINE_S)
    value, took = _bounded(lambda: call(server.url))
    assert took < DEADLINE_S + 3.0, f"{read} took {took:.1f} s against a deadline of {DEADLINE_S} s"
    if read == "tokenize":  # a server without a usable tokenizer: prompts are sized by estimate
        assert value is None
        return
    line = _failure(value)
    assert "\n" not in line
    assert f"{server.url}{path}: no complete answer within {DEADLINE_S:g} s" in line, line


@pytest.mark.parametrize("read", list(READS))
def test_an_endless_answer_stops_at_its_cap(liar, monkeypatch, read: str) -> None:
    path, call, _, cap_name = READS[read]
    server = liar(Behaviour(modes={path: "endless"}))
    _limit(monkeypatch, cap_name, 64 * 1024)
    value, took = _bounded(lambda: call(server.url))
    assert took < 5.0, f"{read} read for {took:.1f} s"
    if read == "tokenize":
        assert value is None
        return
    line = _failure(value)
    assert "\n" not in line
    assert f"{server.url}{path}: answer exceeds 64 KiB" in line, line


def test_every_read_has_a_default_deadline_and_cap() -> None:
    """The limits a run gets without being told, as docs/bench.md's table of reads states them."""
    limits = serverio
    assert (limits.METRICS_DEADLINE_S, limits.STATUS_DEADLINE_S, limits.MODELS_DEADLINE_S) == (10.0, 5.0, 10.0)
    assert limits.TOKENIZE_DEADLINE_S == 30.0
    assert (limits.MAX_METRICS_BYTES, limits.MAX_STATUS_BYTES) == (16 << 20, 4 << 20)
    assert (limits.MAX_ANSWER_BYTES, limits.MAX_STREAM_BYTES) == (64 << 20, 256 << 20)
    doc = (Path(__file__).parents[2] / "docs" / "bench.md").read_text()
    table = doc[doc.index("| read | deadline | cap |") :].split("\n\n")[0].splitlines()[2:]
    rows = {read: (deadline, cap) for read, deadline, cap in (row.strip("| ").split(" | ") for row in table)}
    s, size, request = limits, limits.size_text, "`workload.request_timeout_s`"
    assert rows == {
        "a measured, warmup or determinism request (streamed)": (request, size(s.MAX_STREAM_BYTES)),
        "a quality request (whole answer)": (request, size(s.MAX_ANSWER_BYTES)),
        "`/metrics`": (
            f"{s.METRICS_DEADLINE_S:g} s a scrape; settling (step 4 above) ends 5 s after it starts",
            size(s.MAX_METRICS_BYTES),
        ),
        "`/health` and `/v1/models` while a server starts": (
            f"{s.STATUS_DEADLINE_S:g} s a poll, none past `startup_timeout_s`",
            size(s.MAX_STATUS_BYTES),
        ),
        "`/v1/models`, for the model id": (f"{s.MODELS_DEADLINE_S:g} s", size(s.MAX_STATUS_BYTES)),
        "`/tokenize`, while the prompts are cut": (f"{s.TOKENIZE_DEADLINE_S:g} s", size(s.MAX_ANSWER_BYTES)),
    }


def test_wait_ready_ends_at_the_startup_timeout_however_the_server_drips(liar) -> None:
    server = liar(Behaviour(modes={"/v1/models": "drip"}))
    running = servers.RunningServer(url=server.url)
    value, took = _bounded(lambda: servers.wait_ready(new_client(), running, timeout_s=1.5))
    assert isinstance(value, servers.ServerError), value
    assert took < 4.0, took
    assert f"did not answer at {server.url} within 1.5 s" in str(value)
    assert f"{server.url}/v1/models: no complete answer within" in str(value)


ARMS = """\
repeats = 1
warmups = 0
[workload]
prompt_tokens = [40]
prompts_per_length = 2
max_tokens = 4
[determinism]
replicates = 0
[[arms]]
name = "liar"
url = "{url}"
"""


def _run_arms(sandbox: Sandbox, url: str) -> tuple[Path, Path]:
    arms = sandbox.root / "arms.toml"
    arms.write_text(ARMS.format(url=url))
    return arms, sandbox.root / "out"


def test_bench_run_is_not_held_by_a_metrics_endpoint_that_drips(liar, sandbox: Sandbox) -> None:
    """The reported case: one byte every 4 s kept `bench run` hung past 150 s. With the default
    deadline the window is left out, saying why, and the requests are measured."""
    server = liar(Behaviour(modes={"/metrics": "drip"}, drip_s=4.0))
    arms, out = _run_arms(sandbox, server.url)
    start = time.monotonic()
    result = run_subprocess("bench", "run", arms, "--out", out, "--quiet", timeout=60)
    took = time.monotonic() - start
    assert result.code == 0, result
    assert "Traceback" not in result.err
    assert took < 40, took
    visit = json.loads((out / "results.json").read_text())["visits"][0]
    assert visit["status"] == "ok" and all(r["error"] is None for r in visit["requests"])
    expected = f"{server.url}/metrics: no complete answer within 10 s"
    assert visit["spec"]["status"] == "unavailable" and visit["spec"]["detail"] == expected
    assert expected in (out / "report.md").read_text()


def test_bench_run_is_not_filled_by_an_endless_metrics_body(liar, sandbox: Sandbox) -> None:
    server = liar(Behaviour(modes={"/metrics": "endless"}))
    arms, out = _run_arms(sandbox, server.url)
    result = run_limited("bench", "run", arms, "--out", out, "--quiet", timeout=60)
    assert result.code == 0, result
    assert "Traceback" not in result.err
    visit = json.loads((out / "results.json").read_text())["visits"][0]
    assert visit["spec"]["detail"] == f"{server.url}/metrics: answer exceeds 16 MiB", visit["spec"]
    assert visit["status"] == "ok" and all(r["error"] is None for r in visit["requests"])


def _counters_run(
    liar, tmp_path: Path, lie: Callable[[int], dict[str, str]]
) -> tuple[str, BenchResults, VisitResult, str]:
    """(the liar's URL, the results, their one visit, report.md) of a run against a liar whose counters lie."""
    server = liar(Behaviour(lie=lie))
    config = parse_config(
        {
            "repeats": 1,
            "warmups": 0,
            "workload": {"prompt_tokens": [40], "prompts_per_length": 3, "max_tokens": 4},
            "determinism": {"replicates": 0},
            "arms": [{"name": "liar", "url": server.url, "kind": "vllm"}],
        }
    )
    results = run_bench(config, tmp_path / "out")
    _, files = write_all(results, tmp_path / "out")
    (visit,) = results.visits
    return server.url, results, visit, files["report"].read_text()


@pytest.mark.parametrize(
    ("lie", "name", "says"),
    [
        (lambda n: {"accepted_tokens": "NaN"}, "vllm:spec_decode_num_accepted_tokens_total", "is not a number"),
        (lambda n: {"drafts": "+Inf"}, "vllm:spec_decode_num_drafts_total", "is infinite"),
        (lambda n: {"draft_tokens": f"{-1 - 6 * n}.0"}, "vllm:spec_decode_num_draft_tokens_total", "is negative"),
        (lambda n: {"position=1": "-Inf"}, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "is infinite"),
        (lambda n: {"accepted_tokens": "1e300"}, "vllm:spec_decode_num_accepted_tokens_total", "beyond 2**53"),
    ],
    ids=["nan", "inf", "negative", "per-position-inf", "beyond-exact"],
)
def test_a_counter_that_is_not_a_count_is_named_and_its_window_left_out(
    liar, tmp_path: Path, lie: Callable[[int], dict[str, str]], name: str, says: str
) -> None:
    url, results, visit, report = _counters_run(liar, tmp_path, lie)
    spec = visit.spec
    assert spec is not None and spec.status == m.INVALID, spec
    assert spec.detail.startswith(f"{url}/metrics: {name}") and says in spec.detail, spec.detail
    assert (spec.drafts, spec.acceptance_rate, spec.mean_acceptance_length) == (None, None, None)
    assert all(r.ok and r.spec_drafts is None and r.spec_accepted is None for r in visit.requests)
    (acceptance,) = analyse(results).acceptance
    assert acceptance.status == m.INVALID and acceptance.windows_ok == 0 and acceptance.acceptance_rate is None
    assert name in report and url in report
    assert not NON_NUMBER.findall(report), NON_NUMBER.findall(report)


def test_a_counter_that_goes_backwards_between_requests_voids_the_window(liar, tmp_path: Path) -> None:
    """After the second request the liar reports fewer drafts than after the first, then counts on:
    the window's own two scrapes agree, but the counter went backwards inside it."""
    url, _, visit, report = _counters_run(liar, tmp_path, lambda n: {"drafts": "0.0"} if n == 2 else {})
    spec = visit.spec
    assert spec is not None and spec.status == m.VOID, spec
    assert spec.detail.startswith(f"{url}/metrics after measured request 2: "), spec.detail
    assert "vllm:spec_decode_num_drafts_total" in spec.detail and "went from 2 to 0" in spec.detail
    assert spec.acceptance_rate is None and spec.mean_acceptance_length is None
    assert "vllm:spec_decode_num_drafts_total" in report


def test_a_position_label_far_beyond_any_draft_is_named_not_allocated(liar, sandbox: Sandbox) -> None:
    """A per-position counter at position 1,000,000,000 would need a list of a billion rates."""
    server = liar(Behaviour(lie=lambda n: {"position=1000000000": f"{n}.0"}))
    arms, out = _run_arms(sandbox, server.url)
    result = run_limited("bench", "run", arms, "--out", out, "--quiet", timeout=60)
    assert result.code == 0, result
    spec = json.loads((out / "results.json").read_text())["visits"][0]["spec"]
    assert spec["status"] == "invalid" and spec["detail"].startswith(f"{server.url}/metrics: "), spec
    assert "position 1000000000" in spec["detail"], spec


@pytest.mark.parametrize(
    ("usage", "says"),
    [
        ('{"prompt_tokens": 5, "completion_tokens": NaN}', "not a finite number"),
        ('{"prompt_tokens": 5, "completion_tokens": 1e400}', "not a finite number"),
        ('{"prompt_tokens": 5, "completion_tokens": "4"}', "usage.completion_tokens is not a count"),
        ('{"prompt_tokens": -5, "completion_tokens": 4}', "usage.prompt_tokens is not a count"),
        ('{"prompt_tokens": 5, "completion_tokens": 1000000000000000000000000000000}', "is not a count"),
        ('{"prompt_tokens": 5, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1.5}}', "cached"),
    ],
    ids=["nan", "1e400", "string", "negative", "huge", "cached-float"],
)
def test_a_stream_whose_usage_is_not_a_count_is_a_request_error(liar, usage: str, says: str) -> None:
    server = liar(Behaviour(usage=usage))
    value, _ = _bounded(lambda: cl.stream_request(new_client(), server.url, "completions", _stream_body(), 5.0))
    assert isinstance(value, cl.StreamOutcome), value
    assert value.error is not None and value.error.startswith(f"{server.url}/v1/completions: "), value.error
    assert says in value.error and "\n" not in value.error
    assert not NON_NUMBER.search(value.error), value.error
