"""A stand-in for vLLM's OpenAI-compatible server, for planted truths in tests: exact acceptance
patterns, timings, failures and scripted answers that a real server cannot be made to give. What
bench does against the real one (vLLM's CPU build) is tested in tests/vllm_truth/.

It speaks vLLM's wire format: `/v1/completions` and `/v1/chat/completions` streamed as SSE
(chat opens with a role-only delta, reasoning deltas come before content when asked, a final
`choices: []` chunk carries `usage` when `stream_options.include_usage` is set, then
`data: [DONE]`), legacy completions logprobs (`tokens`, `token_logprobs`, `top_logprobs`),
`/v1/models`, `/health` and `/tokenize`. Requests with `stream: false` get one JSON body, as
vLLM sends it; chat answers may carry `tool_calls` (`message.tool_calls[i].function.{name,
arguments}`, the arguments a JSON string, ids `chatcmpl-tool-...`, finish reason `tool_calls`),
scripted by `answers`: the first marker found in the request's prompt or messages picks the answer.
Its `/metrics` registers the speculative-decoding
counters exactly as vLLM's `SpecDecodingProm` does (prometheus_client, names
`vllm:spec_decode_num_drafts` ..., labels `model_name`, `engine`, `position`), so the exposition
lines are the ones vLLM emits.

Speculative decoding is simulated deterministically: each verification step proposes `k` tokens
and accepts the next value of `accept_pattern`, emitting accepted + 1 tokens in one SSE chunk, so
a test knows exactly what the counters must read. Requests alternate between two engine labels.

Run as a script (`python standin_vllm.py --port N ...`) to be started by the benchmark's runner,
or in a thread with `serve_in_thread`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]


#: vLLM's default VLLM_MAX_STOP_STRINGS (vllm/envs.py, 0.32.0): a request with more stop strings is a 400.
MAX_STOP_STRINGS = 4


@dataclass
class StandinConfig:
    """How the stand-in behaves."""

    model: str = "standin/model"
    k: int = 3
    accept_pattern: list[int] = field(default_factory=lambda: [3, 1, 2, 0])
    ttft_s: float = 0.02
    step_s: float = 0.004
    engines: int = 2
    metrics: bool = True
    reasoning_tokens: int = 0
    think_in_content: bool = False
    die_after: int | None = None
    reset_after: int | None = None
    honour_include_usage: bool = True
    reject_marker: str | None = None
    logprob_jitter: float = 0.0
    #: marker -> {"content": str} and/or {"tool_calls": [{"name": str, "arguments": {...}}]}
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)


class _Metrics:
    """vLLM's spec-decode registration (vllm/v1/spec_decode/metrics.py) plus a few others.

    The spec-decode counters exist only with `k > 0`, as in vLLM (only with a speculative config).
    """

    def __init__(self, k: int, model: str, engines: int) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        reg = self.registry
        self.generation = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=reg
        )
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg)
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=reg
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.spec = k > 0
        if self.spec:
            self.drafts = Counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=reg
            )
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=reg
            )
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels, registry=reg
            )
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",  # vLLM 0.32's HELP text (v1/spec_decode/metrics.py)
                [*labels, "position"],
                registry=reg,
            )
        for engine in range(engines):
            e = str(engine)
            self.generation.labels(model, e)
            self.prompt.labels(model, e)
            self.running.labels(model, e).set(0)
            if self.spec:
                for c in (self.drafts, self.draft_tokens, self.accepted):
                    c.labels(model, e)
                for pos in range(k):
                    self.per_pos.labels(model, e, str(pos))


class Standin:
    """State shared by the request handlers."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.requests = 0
        self.metrics = _Metrics(config.k, config.model, config.engines)

    def next_request(self) -> tuple[int, str]:
        with self.lock:
            self.requests += 1
            n = self.requests
            if self.config.reset_after is not None and n == self.config.reset_after + 1:
                # A restart: every counter starts again from zero.
                self.metrics = _Metrics(self.config.k, self.config.model, self.config.engines)
        return n, str(n % self.config.engines)

    def exposition(self) -> bytes:
        return generate_latest(self.metrics.registry)


def prompt_tokens(text: str) -> int:
    """The stand-in's tokenizer: one token per four characters."""
    return max(1, math.ceil(len(text) / 4))


def _logprob(prompt: str, position: int, jitter: float, salt: str) -> tuple[str, float, dict[str, float]]:
    digest = hashlib.sha256(f"{prompt}|{position}".encode()).digest()
    token = f" t{digest[0]}"
    base = -0.05 - digest[1] / 2550
    if jitter:
        noise = int.from_bytes(hashlib.sha256(f"{salt}|{position}".encode()).digest()[:2], "big") / 65535
        base -= jitter * noise
    top = {token: base, f" u{digest[2]}": base - 2.5, f" v{digest[3]}": base - 3.5}
    return token, base, top


class _Handler(BaseHTTPRequestHandler):
    server_version = "standin-vllm"
    standin: Standin

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("INFO %s\n" % (format % args))

    def _json(self, code: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        cfg = self.standin.config
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": cfg.model, "object": "model", "owned_by": "vllm"}]})
        elif self.path == "/metrics" and cfg.metrics:
            body = self.standin.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"detail": "Not Found"})

    def _error(self, message: str) -> None:
        """A 400 in vLLM's error body layout."""
        self._json(400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length", "0"))
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self) -> None:
        cfg = self.standin.config
        body = self._body()
        if self.path == "/tokenize":
            text = body.get("prompt", "")
            n = prompt_tokens(text)
            self._json(200, {"count": n, "max_model_len": 8192, "tokens": list(range(n))})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        chat = self.path.endswith("chat/completions")
        prompt = (body["messages"][-1].get("content") or "") if chat else body.get("prompt", "")
        if isinstance(body.get("stop"), list) and len(body["stop"]) > MAX_STOP_STRINGS:
            # vLLM validates `stop` against VLLM_MAX_STOP_STRINGS (4 by default) before anything else
            self._error(
                "1 validation error: {'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should have at most "
                f"{MAX_STOP_STRINGS} items after validation, not {len(body['stop'])}'}}"
            )
            return
        if cfg.reject_marker and cfg.reject_marker in prompt:
            self._error("stand-in rejects this prompt")
            return
        n, engine = self.standin.next_request()
        if cfg.die_after is not None and n > cfg.die_after:
            sys.stderr.write("ERROR stand-in engine core died\n")
            sys.stderr.flush()
            os._exit(7)
        # the client may give up first (a timeout test): nothing left to answer then
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if body.get("stream"):
                self._stream(body, prompt, chat, engine)
            else:
                self._whole(body, prompt, chat, engine)

    def _scripted(self, body: dict[str, Any]) -> dict[str, Any] | None:
        asked = json.dumps(body.get("messages")) if "messages" in body else str(body.get("prompt", ""))
        return next((a for marker, a in self.standin.config.answers.items() if marker in asked), None)

    def _count(self, tokens: int, prompt: str, engine: str) -> None:
        """Count a whole generation of `tokens` in /metrics as the streamed path does, step by step."""
        config, metrics = self.standin.config, self.standin.metrics
        emitted = step = 0
        while emitted < tokens:
            n_new = 1
            if emitted and metrics.spec:
                n_new = self._spec_step(step, engine)
                step += 1
            emitted += n_new
        metrics.generation.labels(config.model, engine).inc(tokens)
        metrics.prompt.labels(config.model, engine).inc(prompt_tokens(prompt))

    def _spec_step(self, step: int, engine: str) -> int:
        """One speculative step in /metrics (a draft of k, its accepted tokens, per position); the
        tokens it emits: the accepted ones and the bonus token."""
        config, metrics = self.standin.config, self.standin.metrics
        accepted = min(config.k, config.accept_pattern[step % len(config.accept_pattern)])
        metrics.drafts.labels(config.model, engine).inc()
        metrics.draft_tokens.labels(config.model, engine).inc(config.k)
        metrics.accepted.labels(config.model, engine).inc(accepted)
        for pos in range(accepted):
            metrics.per_pos.labels(config.model, engine, str(pos)).inc()
        return accepted + 1

    def _whole(self, body: dict[str, Any], prompt: str, chat: bool, engine: str) -> None:
        """A non-streamed response, in vLLM's body layout (fields it sends as null included)."""
        config = self.standin.config
        max_tokens = int(body.get("max_tokens", 16))
        scripted = self._scripted(body)
        if scripted is not None:
            text = scripted.get("content") or ""
        else:
            text = "".join(_logprob(prompt, i, 0.0, "")[0] for i in range(max_tokens))
        finish, stop_reason = "stop", None
        for stop in body.get("stop") or []:
            if stop in text:
                text, stop_reason = text[: text.index(stop)], stop
        emitted = prompt_tokens(text) if text else 0
        if scripted is None and stop_reason is None:
            emitted, finish = max_tokens, "length"
        calls = [
            {
                "id": "chatcmpl-tool-" + uuid.uuid4().hex,
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False)},
            }
            for c in (scripted or {}).get("tool_calls", [])
        ]
        if calls:
            finish = "tool_calls"
            emitted += sum(prompt_tokens(c["function"]["arguments"]) for c in calls)
        if chat:
            message = {
                "role": "assistant",
                "content": text or None,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": calls,
                "reasoning_content": None,
            }
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "prompt_logprobs": None,
            }
        n_prompt = prompt_tokens(prompt)
        self._count(emitted, prompt, engine)
        payload = {
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": config.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_prompt,
                "total_tokens": n_prompt + emitted,
                "completion_tokens": emitted,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        if chat:
            payload.update({"service_tier": None, "system_fingerprint": None})
        self._json(200, payload)

    def _send_event(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _stream(self, body: dict[str, Any], prompt: str, chat: bool, engine: str) -> None:
        cfg = self.standin
        config = cfg.config
        max_tokens = int(body.get("max_tokens", 16))
        logprobs = body.get("top_logprobs", 0) if chat else body.get("logprobs", 0)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and config.honour_include_usage
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        salt = uuid.uuid4().hex
        n_prompt = prompt_tokens(prompt)

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            return {"id": rid, "object": obj, "created": created, "model": config.model, "choices": [choice]}

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        start = time.perf_counter()
        metrics = cfg.metrics
        metrics.running.labels(config.model, engine).inc()
        if chat:
            self._send_event(
                chunk(
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                )
            )
        time.sleep(config.ttft_s)
        metrics.ttft.labels(config.model, engine).observe(time.perf_counter() - start)
        emitted = 0
        step = 0
        reasoning_left = config.reasoning_tokens if chat else 0
        while emitted < max_tokens:
            if emitted == 0:
                n_new = 1  # the first token comes from prefill
            elif metrics.spec:
                n_new = self._spec_step(step, engine)
                step += 1
                time.sleep(config.step_s)
            else:
                n_new = 1
                time.sleep(config.step_s)
            n_new = min(n_new, max_tokens - emitted)
            positions = [_logprob(prompt, emitted + i, config.logprob_jitter, salt) for i in range(n_new)]
            text = "".join(p[0] for p in positions)
            if config.think_in_content and emitted == 0:
                text = "</think>" + text
            emitted += n_new
            metrics.generation.labels(config.model, engine).inc(n_new)
            finish = "length" if emitted >= max_tokens else None
            if chat:
                if reasoning_left > 0:
                    delta = {"reasoning": text, "reasoning_content": text}
                    reasoning_left -= n_new
                else:
                    delta = {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                if logprobs:
                    choice["logprobs"] = {
                        "content": [
                            {
                                "token": t,
                                "logprob": lp,
                                "bytes": list(t.encode()),
                                "top_logprobs": [
                                    {"token": a, "logprob": b, "bytes": list(a.encode())}
                                    for a, b in list(top.items())[:logprobs]
                                ],
                            }
                            for t, lp, top in positions
                        ]
                    }
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None}
                if logprobs:
                    choice["logprobs"] = {
                        "text_offset": [0] * n_new,
                        "token_logprobs": [p[1] for p in positions],
                        "tokens": [p[0] for p in positions],
                        "top_logprobs": [dict(list(p[2].items())[:logprobs]) for p in positions],
                    }
            self._send_event(chunk(choice))
            if finish:
                if chat:
                    self._send_event(chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}))
                else:
                    self._send_event(
                        chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": finish, "stop_reason": None})
                    )
        metrics.prompt.labels(config.model, engine).inc(n_prompt)
        metrics.running.labels(config.model, engine).dec()
        if include_usage:
            self._send_event(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": config.model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": n_prompt,
                        "total_tokens": n_prompt + emitted,
                        "completion_tokens": emitted,
                        "prompt_tokens_details": None,
                    },
                }
            )
        self._send_event("[DONE]")


def standin_command(*args: str) -> list[str]:
    """A command line that starts the stand-in as its own process on the runner's `{port}`."""
    return [sys.executable, str(Path(__file__).resolve()), "--port", "{port}", *args]


def make_server(config: StandinConfig, port: int = 0) -> ThreadingHTTPServer:
    """A stand-in bound to 127.0.0.1 (port 0: any free port)."""
    handler = type("Handler", (_Handler,), {"standin": Standin(config)})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(config: StandinConfig) -> tuple[ThreadingHTTPServer, str]:
    """Start a stand-in in a daemon thread; returns the server (call .shutdown()) and its URL."""
    server = make_server(config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="standin/model")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--accept-pattern", default="3,1,2,0")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--step-ms", type=float, default=4.0)
    parser.add_argument("--no-metrics", action="store_true")
    parser.add_argument("--die-after", type=int)
    parser.add_argument("--reset-after", type=int)
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--startup-delay-s", type=float, default=0.0)
    parser.add_argument("--log-line", action="append", default=[])
    parser.add_argument("--think-in-content", action="store_true")
    parser.add_argument("--answers", help="JSON file: marker -> scripted answer (see StandinConfig.answers)")
    args = parser.parse_args(argv)
    sys.stderr.write(f"INFO stand-in for vLLM's OpenAI server, model {args.model}\n")
    sys.stderr.write(f"INFO VLLM_CACHE_ROOT={os.environ.get('VLLM_CACHE_ROOT', '')}\n")
    for line in args.log_line:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()
    if args.fail_start:
        sys.stderr.write("ERROR stand-in: CUDA out of memory while loading the model (simulated)\n")
        sys.exit(3)
    time.sleep(args.startup_delay_s)
    config = StandinConfig(
        model=args.model,
        k=args.k,
        accept_pattern=[int(x) for x in args.accept_pattern.split(",")],
        ttft_s=args.ttft_ms / 1000,
        step_s=args.step_ms / 1000,
        metrics=not args.no_metrics,
        die_after=args.die_after,
        reset_after=args.reset_after,
        think_in_content=args.think_in_content,
        answers=json.loads(Path(args.answers).read_text()) if args.answers else {},
    )
    make_server(config, args.port).serve_forever()


if __name__ == "__main__":
    main()
