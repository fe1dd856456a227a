"""The known cases a user names with `--preset`: what each keeps unquantized, and why.

The plan applies them (`plan.build_plan`), the card quotes their reasons, and preflight names the one
a DFlash draft needs; each reason cites the runtime code that makes it necessary.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def ignore_by_suffix(self) -> bool:
        return self.runtime_names is not None


PRESETS: dict[str, Preset] = {
    "dflash-draft": Preset(
        ("re:.*\\.(q|k|v|qkv)_proj$", "re:.*\\.g_proj$"),
        "vLLM's DFlash proposer reads qkv_proj.weight directly; the g_proj gate stays BF16",
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
