"""Server kinds: everything bench knows about one kind of server, in one entry.

A kind (vLLM, llama.cpp's llama-server, SGLang, anything else) decides how an arm's command is
recognised, which Prometheus names carry its speculative-decoding counters, what its readiness
and `/tokenize` quirks are, which environment variable isolates its compile cache, and which log
lines say it runs something other than what it claims. Adding a kind is one `ServerKind` in
`KINDS` (plus its tests); config, servers, client, metrics and the log check read it from here.

The kind's `name` is the one spelling the arms file and the results use. Its metric names keep
the server's own Prometheus prefix (`llamacpp:`), which results record as the window's `flavour`:
what `/metrics` showed, checked against the arm's kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from weightsmith.core.severity import ERROR, INFO, WARNING, Severity

#: Where a log pattern looks: the server's log, or the text of its responses.
LOG = "log"
CONTENT = "content"

#: What the arms file may say for `kind` besides a kind's name: guess it from the command.
AUTO = "auto"


@dataclass(frozen=True)
class SpecMetricNames:
    """Sample names (as exposed, with `_total`) of one server kind's spec-decode counters.

    `flavour` is the kind's Prometheus prefix; results record it for each window.
    """

    flavour: str
    drafts: str
    draft_tokens: str
    accepted: str
    accepted_per_pos: str
    generation_tokens: str

    @classmethod
    def prefixed(cls, prefix: str, generation_tokens: str) -> SpecMetricNames:
        """The four `spec_decode_*` counters under `prefix:`, as vLLM and llama.cpp both name them."""
        spec = f"{prefix}:spec_decode_num"
        return cls(
            flavour=prefix,
            drafts=f"{spec}_drafts_total",
            draft_tokens=f"{spec}_draft_tokens_total",
            accepted=f"{spec}_accepted_tokens_total",
            accepted_per_pos=f"{spec}_accepted_tokens_per_pos_total",
            generation_tokens=f"{prefix}:{generation_tokens}",
        )

    def counters(self) -> tuple[str, str, str, str]:
        """The four spec-decode counters (not the generation-token counter)."""
        return (self.drafts, self.draft_tokens, self.accepted, self.accepted_per_pos)


@dataclass(frozen=True)
class CounterlessMetrics:
    """A kind whose /metrics has no spec-decode counters, so no window's acceptance can be read.

    Its samples are recognised by the prefix `flavour`; a window then says `unavailable` with `why`
    (acceptance absent, never zero) instead of `not-speculating`, which would claim the server runs
    without a draft.
    """

    flavour: str
    generation_tokens: str
    why: str


@dataclass(frozen=True)
class EvidencePattern:
    """One thing to look for: where, the regex (group `value` is reported), and what it means."""

    id: str
    source: str
    regex: re.Pattern[str]
    severity: Severity
    meaning: str


def pattern(id_: str, source: str, regex: str, severity: Severity, meaning: str) -> EvidencePattern:
    """An `EvidencePattern` with its regex compiled case-insensitively."""
    return EvidencePattern(id_, source, re.compile(regex, re.IGNORECASE), severity, meaning)


@dataclass(frozen=True)
class ServerKind:
    """One kind of server and each quirk bench must know about it."""

    #: The one spelling of the kind, in the arms file, results and reports.
    name: str
    #: Words in the base name of one of the command's first three tokens that mark this kind.
    command_marks: tuple[str, ...] = ()
    #: Its spec-decode counters on /metrics, or how its /metrics is recognised when it has none.
    metrics: SpecMetricNames | CounterlessMetrics | None = None
    #: Why /metrics may be missing (shown when it answers 404 or 501).
    metrics_hint: str = ""
    #: A /health status meaning "still loading" rather than "serving".
    loading_status: int | None = None
    #: The `/tokenize` body field this kind reads the text from.
    tokenize_field: str | None = None
    #: The environment variable of its compile cache, set fresh per arm (a shared cache can hand
    #: one arm another arm's compiled graphs).
    cache_env: str | None = None
    #: Log lines that say the server runs something other than what it claims.
    log_patterns: tuple[EvidencePattern, ...] = ()

    def marks(self, command: list[str] | None) -> bool:
        """True when the command's program (among its first three tokens) is this kind's."""
        bases = [Path(token).name.lower() for token in (command or [])[:3]]
        return any(mark in base for base in bases for mark in self.command_marks)


# vllm/v1/spec_decode/metrics.py (`SpecDecodingProm`), labels `model_name`, `engine`, `position`.
VLLM_METRICS = SpecMetricNames.prefixed("vllm", "generation_tokens_total")
# llama.cpp tools/server/server-task.cpp `to_metrics()`: the same four counters, only a `position`
# label, folded in when a request ends.
LLAMA_CPP_METRICS = SpecMetricNames.prefixed("llamacpp", "tokens_predicted_total")

VLLM = ServerKind(
    name="vllm",
    command_marks=("vllm",),
    metrics=VLLM_METRICS,
    tokenize_field="prompt",
    # vLLM's compile cache is keyed without the draft's quantization.
    cache_env="VLLM_CACHE_ROOT",
    log_patterns=(
        pattern(
            "nvfp4-moe-backend",
            LOG,
            r"Using '?(?P<value>[A-Za-z0-9_ ]{1,64}?)'? NvFp4 MoE backend",
            INFO,
            "vLLM chose this NVFP4 MoE kernel backend",
        ),
        pattern(
            "nvfp4-moe-drops-activation-scales",
            LOG,
            r"Using '?(?P<value>MARLIN|HUMMING)'? NvFp4 MoE backend",
            ERROR,
            "weight-only (W4A16) MoE backend: the checkpoint's NVFP4 activation scales are not applied",
        ),
        pattern(
            "fp4-marlin-fallback",
            LOG,
            r"FP4 quantization is being used\. Marlin kernel fallback",
            WARNING,
            "no native FP4 on this GPU: FP4 layers run through Marlin, activation scales not applied",
        ),
        pattern(
            "kv-cache-scale-1.0",
            LOG,
            r"Using KV cache scaling factor 1\.0 for fp8_e4m3",
            ERROR,
            "FP8 KV cache with scale 1.0: the checkpoint's k/v scales are missing or were not loaded",
        ),
        pattern(
            "reasoning-parser-autoinit-failed",
            LOG,
            r"Auto-initialization of reasoning token IDs failed",
            ERROR,
            "the reasoning parser could not find its start/end tokens: reasoning may land in content",
        ),
        pattern(
            "weights-not-initialized",
            LOG,
            r"(?:Following|Some)(?: text encoder)? weights (?:were|are) not initialized from checkpoint",
            ERROR,
            "some weights were not loaded from the checkpoint (name mapping or missing shard)",
        ),
        pattern(
            "quantization-method",
            LOG,
            r"(?:\bquantization=|'quantization': ')(?P<value>[A-Za-z0-9_.-]+)",
            INFO,
            "quantization method vLLM picked for the model",
        ),
        pattern(
            "linear-kernel",
            LOG,
            r"\b(?:Using|Selected) (?P<value>\w{1,64}Kernel) for CompressedTensors\w{1,64}",
            INFO,
            "linear kernel vLLM chose for a quantized layer (target's or draft's)",
        ),
        pattern(
            "linear-scheme",
            LOG,
            r"\b(?:Using|Selected) \w{1,64}Kernel for (?P<value>CompressedTensors\w{1,64})",
            INFO,
            "compressed-tensors scheme vLLM read for a quantized layer (target's or draft's)",
        ),
        pattern(
            "tool-call-parser",
            LOG,
            r"'tool_call_parser': '(?P<value>[\w.-]{1,64})'",
            INFO,
            "parser vLLM turns the model's text into tool calls with (the calls a quality suite scores)",
        ),
        pattern(
            "spec-decode-cpu-without-iomp",
            LOG,
            r"Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD",
            WARNING,
            "vLLM CPU: speculative decoding without Intel OpenMP preloaded runs much slower",
        ),
        pattern(
            "speculative-config",
            LOG,
            r"speculative_config=(?P<value>None|SpeculativeConfig\([^)]{0,4096}\))",
            INFO,
            "speculative decoding configuration vLLM runs with",
        ),
    ),
)

LLAMA_CPP = ServerKind(
    name="llama.cpp",
    command_marks=("llama-server",),
    metrics=LLAMA_CPP_METRICS,
    metrics_hint="llama-server needs --metrics",
    loading_status=503,
    tokenize_field="content",
    log_patterns=(
        pattern(
            "gguf-file-type",
            LOG,
            r"\bfile type\s+=\s+(?P<value>\S.*)",
            INFO,
            "llama.cpp: quantization type of the GGUF file",
        ),
        pattern(
            "llamacpp-draft-acceptance",
            LOG,
            r"draft acceptance = (?P<value>[0-9.]+)",
            INFO,
            "llama.cpp's own per-request acceptance line (cross-check for /metrics)",
        ),
    ),
)

# SGLang (sgl-project/sglang; each fact's file and commit is in the shared reference facts). With
# `--enable-metrics` its /metrics has speculative decoding only as two gauges of its last log
# interval (`sglang:spec_accept_length`, `sglang:spec_accept_rate`, metrics/collector.py): no
# counter to difference over a window, so its acceptance is reported absent. Its generation-token
# counter grows when a request finishes and is labelled `model_name` (tokenizer_manager.py).
SGLANG = ServerKind(
    name="sglang",
    # `sglang serve` (cli/main.py) and `python -m sglang.launch_server` (launch_server.py)
    command_marks=("sglang",),
    metrics=CounterlessMetrics(
        flavour="sglang",
        generation_tokens="sglang:generation_tokens_total",
        why="SGLang's /metrics has no spec-decode counters, only gauges of its last log interval "
        "(sglang:spec_accept_length, sglang:spec_accept_rate), so a window's acceptance cannot be measured",
    ),
    metrics_hint="SGLang needs --enable-metrics",
    # /health and /health_generate answer 503 until the server's own warm-up request has run
    loading_status=503,
    # /tokenize and /v1/tokenize read `prompt` and `add_special_tokens`, as vLLM does
    tokenize_field="prompt",
    # the root of SGLang's own kernel caches (DeepGEMM, JIT builds, CuTe AOT objects; environ.py)
    cache_env="SGLANG_CACHE_DIR",
    log_patterns=(
        pattern(
            "sglang-kv-cache-scale-1.0",
            LOG,
            r"Using FP8 KV cache but no scaling factors provided\. Defaulting to scaling factors of 1\.0",
            WARNING,
            "FP8 KV cache given no scales file: k/v scales are 1.0 unless the checkpoint's own were loaded",
        ),
        pattern(
            "sglang-speculative-algorithm",
            LOG,
            r"\bspeculative_algorithm(?:=|': )'(?P<value>[A-Za-z0-9_]{1,32})'",
            INFO,
            "speculative decoding algorithm SGLang runs with",
        ),
        pattern(
            "sglang-accept-length",
            LOG,
            r"\baccept len: (?P<value>[0-9.]{1,16})",
            INFO,
            "SGLang's own acceptance length over a log interval (its /metrics has no counters to window)",
        ),
    ),
)

#: Any other OpenAI-compatible server: nothing known beyond the API.
OTHER = ServerKind(name="other")

#: Every kind, in the order commands are matched against them (`OTHER`, matching nothing, last).
KINDS: tuple[ServerKind, ...] = (VLLM, LLAMA_CPP, SGLANG, OTHER)

#: What `kind` may be in the arms file.
KIND_NAMES: tuple[str, ...] = (AUTO, *(k.name for k in KINDS))


def kind_named(name: str) -> ServerKind:
    """The kind spelled `name` (a `KIND_NAMES` entry other than `auto`)."""
    return next(k for k in KINDS if k.name == name)


def detect(command: list[str] | None) -> ServerKind:
    """The kind whose program the command runs, else `OTHER`."""
    return next((k for k in KINDS if k.marks(command)), OTHER)


def with_flavour(flavour: str) -> ServerKind | None:
    """The kind whose /metrics prefix is `flavour`."""
    return next((k for k in KINDS if k.metrics is not None and k.metrics.flavour == flavour), None)


def metric_names() -> tuple[SpecMetricNames, ...]:
    """Every kind's spec-decode names: /metrics is matched against all of them, whatever the arm says."""
    return tuple(k.metrics for k in KINDS if isinstance(k.metrics, SpecMetricNames))


def counterless_metrics() -> tuple[CounterlessMetrics, ...]:
    """The kinds whose /metrics is recognised but has no spec-decode counters."""
    return tuple(k.metrics for k in KINDS if isinstance(k.metrics, CounterlessMetrics))


def loading_statuses() -> frozenset[int]:
    """/health statuses that mean "loading" for some kind (a url arm's kind is often unknown)."""
    return frozenset(k.loading_status for k in KINDS if k.loading_status is not None)


def metrics_hints() -> str:
    """Every kind's reason /metrics may be missing, joined for one message."""
    return "; ".join(k.metrics_hint for k in KINDS if k.metrics_hint)


def tokenize_body(model: str, text: str) -> dict[str, object]:
    """A `/tokenize` body every kind reads: the text under each kind's field (a server ignores
    the fields it does not read, and the first arm, which sizes the prompts, may be of any kind)."""
    body: dict[str, object] = {"model": model}
    for k in KINDS:
        if k.tokenize_field is not None:
            body[k.tokenize_field] = text
    body["add_special_tokens"] = False
    return body
