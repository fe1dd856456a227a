"""What weight error does to predictions: both checkpoints run through transformers on CPU.

On one text sample (by default code from Python's standard library, which every machine has), we
compare next-token distributions of ORIG and QUANT: KL divergence from ORIG to QUANT (nats, mean
over positions), top-1 agreement, and the perplexity of each. QUANT is loaded by
`AutoModelForCausalLM.from_pretrained(QUANT)`, which goes through compressed-tensors exactly as a
user's would, so a clean run also proves the checkpoint loads.

torch, transformers and compressed-tensors are optional. Without them, without a tokenizer, for an
architecture transformers cannot build, or when the float32 model would not fit in memory, the
result says "unavailable" and why; that is a fact about this machine, not an error. QUANT failing
to load (or loading with weights missing) is a finding about the checkpoint: "failed".
Models are loaded one after the other in float32, so peak memory is about one float32 model.
"""

from __future__ import annotations

import gc
import importlib
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io.checkpoint import CONFIG_FILE, Checkpoint, check_tokenizer_files, read_json, refuse_remote_code
from weightsmith.io.texts import default_text

REQUIRED_LIBRARIES = ("torch", "transformers", "compressed_tensors")
#: What `quantize --method gptq` runs on: transformers' modules and torch (the checkpoint is read and decoded
#: by our own readers; compressed-tensors' import alone is 0.1 s of a GPTQ run's start).
ENGINE_LIBRARIES = ("torch", "transformers")
DEFAULT_TOKENS = 512
OK, UNAVAILABLE, FAILED, SKIPPED = "ok", "unavailable", "failed", "skipped"
#: Float32 weights times this must fit in available memory (activations, loader copies, logits).
MEMORY_HEADROOM = 1.5
#: Positions per float64 chunk of the KL and perplexity sums (64 x a 256k vocabulary: 128 MiB).
POSITIONS_PER_CHUNK = 64
#: Names shown from a list of missing or unexpected weights before "and N more".
SHOWN_KEYS = 3


@dataclass
class LogitsReport:
    """Next-token fidelity of QUANT against ORIG; the figures are None unless status is "ok"."""

    status: str
    reason: str | None = None
    text_source: str | None = None
    tokens: int = 0
    #: characters of the text those tokens cover: what the models read of it
    text_chars: int = 0
    #: mean over positions of KL(P_orig || P_quant), in nats
    kl: float | None = None
    top1_agreement: float | None = None
    ppl_orig: float | None = None
    ppl_quant: float | None = None
    seconds: float = 0.0


def missing_library(libraries: tuple[str, ...] = REQUIRED_LIBRARIES) -> str | None:
    """Why the optional libraries cannot be used, or None when all import."""
    for name in libraries:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{name.replace('_', '-')} is not installed ({exc}); install torch, transformers, compressed-tensors"
    return None


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, or None where the system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def float32_bytes(folder: str | Path) -> int:
    """Bytes the checkpoint's float tensors take in float32 (headers only)."""
    ckpt = Checkpoint.open(folder)
    return 4 * sum(ref.info.numel for ref in ckpt.tensors.values() if ref.info.dtype.is_float)


def memory_shortfall(orig_dir: str | Path) -> str | None:
    """Why ORIG's float32 model would not fit in the memory available now, or None."""
    available = available_memory()
    needed = float32_bytes(orig_dir) * MEMORY_HEADROOM
    if available is not None and needed > available:
        return (
            f"the model needs about {needed / 2**30:.1f} GiB in float32 on CPU and "
            f"{available / 2**30:.1f} GiB is available"
        )
    return None


def perplexity(logits: Any, ids: Any) -> float:
    """exp(mean next-token negative log-likelihood); `logits` [T, V], `ids` [1, T]. Float64, by chunks."""
    import torch

    targets = ids[0, 1:]
    nll = 0.0
    for s in range(0, len(targets), POSITIONS_PER_CHUNK):
        chunk = logits[s : min(s + POSITIONS_PER_CHUNK, len(targets))].double()
        nll += torch.nn.functional.cross_entropy(chunk, targets[s : s + len(chunk)], reduction="sum").item()
    return math.exp(nll / len(targets))


def kl_divergence(ref_logits: Any, logits: Any) -> float:
    """Mean over positions of KL(P_ref || P), in nats.

    In float64: a well-quantized model's KL is 1e-4 or less, a sum of terms that cancel, and
    float32 loses about a part in a thousand of it. Chunks of positions bound the float64 copies.
    """
    import torch

    total = 0.0
    for s in range(0, len(ref_logits), POSITIONS_PER_CHUNK):
        log_p = torch.log_softmax(ref_logits[s : s + POSITIONS_PER_CHUNK].double(), -1)
        log_q = torch.log_softmax(logits[s : s + POSITIONS_PER_CHUNK].double(), -1)
        total += (log_p.exp() * (log_p - log_q)).sum().item()
    return total / len(ref_logits)


def top1_agreement(ref_logits: Any, logits: Any) -> float:
    """Fraction of positions where both models rank the same next token first."""
    return float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _keys(keys: Any) -> str:
    listed = sorted(str(k[0] if isinstance(k, tuple) else k) for k in keys)
    more = f" and {len(listed) - SHOWN_KEYS} more" if len(listed) > SHOWN_KEYS else ""
    return ", ".join(listed[:SHOWN_KEYS]) + more


def dequantize_on_load(folder: str | Path) -> Any:
    """transformers' loading config that dequantizes a quantized checkpoint at load time, or None.

    Left compressed, compressed-tensors decompresses on the first forward pass into the scale
    dtype (NVFP4: BF16), which a float32 model cannot multiply; dequantized at load, the weights
    are widened to float32 with the rest of the model (exactly). FP8 originals go the same way.
    """
    import transformers

    qc = read_json(Path(folder) / CONFIG_FILE, "config.json").get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method == ct.QUANT_METHOD:
        return transformers.CompressedTensorsConfig(dequantize=True)
    if method == "fp8":
        return transformers.FineGrainedFP8Config(dequantize=True)
    return None


def load_model(folder: str | Path, *, trust_remote_code: bool = False) -> Any:
    """A causal LM in float32 on CPU, in eval mode. Raises ValueError if any weight did not load."""
    import torch
    import transformers

    refuse_remote_code(Path(folder), trust_remote_code)
    extra = {}
    loading = dequantize_on_load(folder)
    if loading is not None:
        extra["quantization_config"] = loading
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*loading attributes.*", category=UserWarning)
        # with output_loading_info the result is a (model, info) pair, which transformers' annotation omits
        loaded: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder),
            dtype=torch.float32,
            local_files_only=True,
            output_loading_info=True,
            trust_remote_code=trust_remote_code,
            **extra,
        )
        model, info = loaded
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            raise ValueError(f"{kind.replace('_', ' ')}: {_keys(info[kind])}")
    return model.to(torch.float32).eval()


def load_tokenizer(*folders: str | Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of the first folder that has one. Raises OSError (or the loader's error) if none,
    and `refuse_remote_code`'s error for a folder that ships its own code untrusted."""
    import transformers

    problem: Exception | None = None
    for folder in folders:
        refuse_remote_code(Path(folder), trust_remote_code)
        check_tokenizer_files(Path(folder))
        try:
            return transformers.AutoTokenizer.from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=trust_remote_code
            )
        except Exception as exc:  # transformers raises many types for a folder without a tokenizer
            problem = exc
    assert problem is not None
    raise problem


def first_tokens(tokenizer: Any, text: str, tokens: int, *, special: bool) -> tuple[list[int], int, bool]:
    """The first `tokens` token ids of `text` (with the tokenizer's special tokens when `special`), how
    many characters of `text` they cover, and whether `text` has more tokens.

    The characters covered are the part a model reads, which `eval` compares with the calibration text
    (`io.textchunks`) and a calibration record keeps. A fast tokenizer says where each token ends;
    another's tokens are decoded back, which may count a space or so fewer
    (`clean_up_tokenization_spaces`): nothing next to a chunk's hundreds of characters.
    """
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        ids = list(encoded.input_ids[:tokens])
        covered = max((end for _, end in encoded.offset_mapping[: len(ids)]), default=0)
        return ids, covered, len(encoded.input_ids) > tokens
    every = tokenizer(text, add_special_tokens=special).input_ids
    ids, more = list(every[:tokens]), len(every) > tokens
    return ids, len(tokenizer.decode(ids, skip_special_tokens=True)) if more else len(text), more


def next_token_logits(model: Any, ids: Any) -> Any:
    """Logits [T, V] in float32 for every position of `ids` [1, T]."""
    import torch

    with torch.no_grad():
        return model(ids).logits[0].float()


def compare(
    orig_dir: str | Path,
    quant_dir: str | Path,
    text: str | None = None,
    tokens: int = DEFAULT_TOKENS,
    text_source: str | None = None,
    *,
    trust_remote_code: bool = False,
) -> LogitsReport:
    """KL, top-1 agreement and perplexities of QUANT against ORIG on `text` (default: stdlib code).

    The text is cut to its first `tokens` tokens. Returns status "unavailable" (with the reason)
    when this machine cannot run ORIG, "failed" when QUANT does not load cleanly.
    """
    started = time.perf_counter()
    if text is None:
        sample = default_text()
        text, text_source = sample.text, sample.source
    report = LogitsReport(UNAVAILABLE, text_source=text_source or "text given")

    def finish(status: str, reason: str | None = None) -> LogitsReport:
        report.status, report.reason, report.seconds = status, reason, time.perf_counter() - started
        return report

    reason = missing_library() or memory_shortfall(orig_dir)
    if reason is not None:
        return finish(UNAVAILABLE, reason)
    try:
        tokenizer = load_tokenizer(orig_dir, quant_dir, trust_remote_code=trust_remote_code)
    except WeightsmithError:
        raise
    except Exception as exc:
        return finish(UNAVAILABLE, f"no tokenizer transformers can load in ORIG or QUANT ({_first_line(exc)})")
    import torch

    first, report.text_chars, _ = first_tokens(tokenizer, text, tokens, special=True)
    ids = torch.tensor([first], dtype=torch.long)
    report.tokens = len(first)
    if report.tokens < 2:
        raise WeightsmithError(f"gives {report.tokens} token(s); at least 2 are needed", file=report.text_source)

    try:
        model = load_model(orig_dir, trust_remote_code=trust_remote_code)
    except Exception as exc:  # whatever transformers raises, it means this machine cannot run ORIG
        return finish(UNAVAILABLE, f"transformers cannot build ORIG on CPU ({_first_line(exc)})")
    try:
        ref_logits = next_token_logits(model, ids)
    except Exception as exc:  # e.g. an architecture whose CPU path is missing in this torch
        return finish(UNAVAILABLE, f"transformers cannot run ORIG on CPU ({_first_line(exc)})")
    del model
    gc.collect()

    try:
        logits = served_logits(Path(quant_dir), ids, trust_remote_code=trust_remote_code)
    except _NotLoaded as exc:  # the checkpoint itself is at fault: report it as a finding
        return finish(FAILED, f"QUANT does not load as served ({_first_line(exc.__cause__ or exc)})")
    except Exception as exc:  # ORIG ran, so the difference lies in QUANT
        return finish(FAILED, f"QUANT loads but cannot run ({_first_line(exc)})")
    gc.collect()
    if logits.shape != ref_logits.shape:
        return finish(FAILED, f"QUANT gives logits of shape {list(logits.shape)}, ORIG {list(ref_logits.shape)}")

    report.kl = kl_divergence(ref_logits, logits)
    report.top1_agreement = top1_agreement(ref_logits, logits)
    report.ppl_orig = perplexity(ref_logits, ids)
    report.ppl_quant = perplexity(logits, ids)
    return finish(OK)


class _NotLoaded(Exception):
    """QUANT's model could not be built or loaded (its cause says why)."""


def served_logits(folder: Path, ids: Any, *, trust_remote_code: bool = False) -> Any:
    """Logits [T, V] of `ids` by the checkpoint in `folder` as a server computes them: its weights decoded
    by our own decompressors (`formats.compressors`, through the engine's loader: every layout quantize
    writes, MoE experts merged as transformers merges them), and each Linear's input quantized with its
    stored activation scale (`activations.served_inputs`: W4A4 experts included). transformers'
    compressed-tensors loader refuses several of these layouts (MoE experts under a quantization config);
    tests/fidelity/test_eval_logits.py keeps it as a cross-check where it loads. Raises `_NotLoaded` when
    the model cannot be built or loaded, a stored activation scale's error when one is bad."""
    from weightsmith.engine.loading import TOP, opened
    from weightsmith.fidelity.activations import input_quantizers, served_inputs

    try:
        with opened(folder, trust_remote_code=trust_remote_code) as loader:
            for unit in (TOP, *range(len(loader.skeleton.layers))):
                loader.load(unit)  # every weight is read here: the source is closed once they are all in
    except Exception as exc:
        raise _NotLoaded from exc
    quantizers = input_quantizers(loader.source.ckpt)  # stored activation scales, applied as served
    with served_inputs(loader, quantizers):
        return next_token_logits(loader.skeleton.model, ids)
