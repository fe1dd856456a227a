"""The model's own modules, built on the meta device, and where its parts are.

Nothing here knows a model family: the decoder layers are the ModuleList whose length is
`num_hidden_layers`, the embeddings and the head are what `get_input_embeddings` and
`get_output_embeddings` return, and every parameter outside the layers (embeddings, final norm,
head) is "top level". Non-persistent buffers (rotary frequencies, embedding scales) are not in any
checkpoint, so they are made real at once and initialised by the model's own `_init_weights`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.core.errors import CheckpointError
from weightsmith.io.checkpoint import CONFIG_FILE, refuse_remote_code


@dataclass
class Skeleton:
    """A causal LM whose weights are all on the meta device until a part is materialised."""

    model: Any  # the *ForCausalLM module
    config: Any
    layers: Any  # the decoder layers' ModuleList
    layers_path: str  # its module path, e.g. "model.layers"

    def layer_path(self, index: int) -> str:
        return f"{self.layers_path}.{index}"

    @property
    def architecture(self) -> str:
        return type(self.model).__name__


def build(ckpt_dir: Path, *, trust_remote_code: bool = False) -> Skeleton:
    """The checkpoint's causal LM on the meta device, or one line naming what cannot be built."""
    import torch
    import transformers

    config_path = Path(ckpt_dir) / CONFIG_FILE
    refuse_remote_code(ckpt_dir, trust_remote_code)
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(ckpt_dir), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError... for an unknown model_type
        raise CheckpointError(
            f"transformers cannot read this config ({_first_line(exc)})",
            file=config_path,
            code="engine.architecture",
        ) from None
    if hasattr(config, "quantization_config"):  # built plain: quantized layers are dequantized as read
        del config.quantization_config
    architecture = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = transformers.AutoModelForCausalLM.from_config(
                config, dtype=torch.float32, trust_remote_code=trust_remote_code
            )
    except Exception as exc:  # an architecture transformers has no causal LM for
        raise CheckpointError(
            f"the engine cannot build {architecture} as a causal LM in transformers ({_first_line(exc)})",
            file=config_path,
            code="engine.architecture",
        ) from None
    model.eval()
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "eager"  # one expert's slice at a time: see `experts`
    layers_path = _decoder_layers(model, config, architecture, config_path)
    _materialise_buffers(model)
    return Skeleton(model, model.config, model.get_submodule(layers_path), layers_path)


def _decoder_layers(model: Any, config: Any, architecture: str, config_path: Path) -> str:
    """The path of the one ModuleList as long as `num_hidden_layers`."""
    import torch

    count = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config, "num_hidden_layers", 0)
    found: list[str] = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and count > 0
    ]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(found[:3])})"
        raise CheckpointError(
            f"the engine cannot run {architecture}: it has {what} list of {count} decoder layers",
            file=config_path,
            code="engine.architecture",
        )
    if model.get_output_embeddings() is None:
        raise CheckpointError(
            f"the engine cannot run {architecture}: it has no output embeddings (lm_head)",
            file=config_path,
            code="engine.architecture",
        )
    return found[0]


def _materialise_buffers(model: Any) -> None:
    """Non-persistent buffers on CPU, initialised as `from_pretrained` initialises them."""
    import torch

    owners = {}
    for name, _ in model.named_non_persistent_buffers():
        path, _, attr = name.rpartition(".")
        module = model.get_submodule(path)
        module._buffers[attr] = torch.empty_like(module._buffers[attr], device="cpu")
        owners[path] = module
    with torch.no_grad():
        for module in owners.values():
            model._init_weights(module)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
