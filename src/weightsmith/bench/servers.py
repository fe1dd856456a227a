"""Start, watch and stop the server behind an arm.

An arm either names a running server (`url`), which is used as found, or a command, which is
started in its own process group with its output kept in a log file (the log check reads it, and
a failure report shows its end). An arm whose kind has a compile cache (vLLM's `VLLM_CACHE_ROOT`,
`bench/kinds.py`) gets its own unless told otherwise: a shared cache could hand a second arm the
first arm's compiled graphs.

Readiness is read through `serverio`: each /health and /v1/models poll ends within
`serverio.STATUS_DEADLINE_S` and what is left of the arm's start-up time, so a server that drips or
never ends its answer costs no more than that, and the failure says what the last poll met.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from weightsmith.bench import kinds, serverio
from weightsmith.bench.client import listed_models
from weightsmith.bench.config import PORT_PLACEHOLDER, ArmSpec
from weightsmith.bench.logcheck import COMMAND_LINE_PREFIX
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import open_append
from weightsmith.core.terminal import shell_line


class ServerError(Exception):
    """The server could not be started or stopped answering; `log_tail` holds its last lines."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range, chosen at random.

    A port the kernel handed out for `bind(0)` can be handed out again to any other process before
    the server binds it; ports below the ephemeral range are never handed out that way, so only
    another explicit choice could collide, and a random one rarely does.
    """
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _attempt in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path | None, lines: int = 20) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        data = f.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


@dataclass
class RunningServer:
    """A server an arm is measured on; `process` is None for a server we did not start."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    startup_s: float | None = None

    def alive(self, grace_s: float = 0.0) -> bool:
        """False once a server we started has exited (a `url` arm is assumed alive).

        `grace_s` waits that long for an exit already under way: a server that dies closes its
        sockets before the kernel reports it gone, so a refused request can come first.
        """
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return True
        return False

    def exit_code(self) -> int | None:
        """The exit status of a server we started, once it has exited."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for failure messages."""
        return tail(self.log_path, lines)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL after `grace_s`."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _status(client: httpx.Client, url: str, until: float | None) -> serverio.Reply:
    """One /health or /v1/models read, within `serverio.STATUS_DEADLINE_S` and before `until`."""
    deadline_s = serverio.STATUS_DEADLINE_S
    if until is not None:
        deadline_s = max(0.01, min(deadline_s, until - time.monotonic()))
    return serverio.fetch(client, "GET", url, deadline_s=deadline_s, max_bytes=serverio.MAX_STATUS_BYTES)


def _not_ready(client: httpx.Client, url: str, until: float | None = None) -> str | None:
    """None once loaded and serving: /health is not a kind's "loading" status (llama.cpp's 503) and
    /v1/models lists a model; else what the poll met, one line naming the URL. No read outlasts `until`."""
    try:
        health = _status(client, url + "/health", until)
        if health.status in kinds.loading_statuses():
            return f"{health.url}: HTTP {health.status} (still loading)"
        listed_models(_status(client, url + "/v1/models", until))
    except serverio.ServerReadError as exc:
        return str(exc)
    return None


def wait_ready(client: httpx.Client, server: RunningServer, timeout_s: float, poll_s: float = 0.25) -> None:
    """Block until the server answers; raise `ServerError` if it exits or the time runs out (no poll
    outlasts it, however slowly the server answers)."""
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if not server.alive():
            raise ServerError(
                f"server exited with status {server.exit_code()} before answering",
                server.log_tail(),
            )
        why = _not_ready(client, server.url, deadline)
        if why is None and server.alive():
            server.startup_s = time.monotonic() - start
            return
        if time.monotonic() > deadline:
            server.stop()
            last = f" (last: {why})" if why else ""
            raise ServerError(f"server did not answer at {server.url} within {timeout_s:g} s{last}", server.log_tail())
        time.sleep(poll_s)


def start_server(
    arm: ArmSpec, client: httpx.Client, out_dir: Path, log_name: str, cache_root: Path | None
) -> RunningServer:
    """Start the arm's command (or find its url) and wait until it serves.

    `{port}` in the command, url and env becomes a free loopback port; the command's output is
    appended to `out_dir/log_name` (never through a link: `open_append`); `cache_root`, when given,
    becomes the kind's cache variable unless the arm sets it.
    """
    if arm.command is None:
        assert arm.url is not None
        server = RunningServer(url=arm.url.rstrip("/"))
        why = _not_ready(client, server.url)
        if why is not None:
            raise ServerError(f"no server answering: {why}")
        return server
    port = str(free_port())
    command = [t.replace(PORT_PLACEHOLDER, port) for t in arm.command]
    url = (arm.url or f"http://127.0.0.1:{PORT_PLACEHOLDER}").replace(PORT_PLACEHOLDER, port)
    env = dict(os.environ)
    env.update({k: v.replace(PORT_PLACEHOLDER, port) for k, v in arm.env.items()})
    cache_env = arm.server_kind.cache_env
    if cache_root is not None and cache_env is not None and cache_env not in arm.env:
        cache_root.mkdir(parents=True, exist_ok=True)
        env[cache_env] = str(cache_root)
    log_path = out_dir / log_name
    try:
        log = os.fdopen(open_append(out_dir, log_name), "ab")
    except OSError as exc:
        raise ServerError(f"cannot write its log {log_path}: {exc.strerror or exc}") from None
    except WeightsmithError as exc:
        raise ServerError(f"cannot write its log {log_path}: {exc.message}") from None
    with log:
        # one line that pastes as exactly this argv: a word's line break or escape sequence would
        # otherwise start a line the log check reads as the server's, or act on a terminal showing the log
        log.write(f"{COMMAND_LINE_PREFIX}{shell_line(command)}\n".encode())
        log.flush()
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerError(f"cannot run {command[0]!r}: {exc.strerror}") from None
    server = RunningServer(url=url.rstrip("/"), process=process, log_path=log_path)
    try:
        wait_ready(client, server, arm.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
