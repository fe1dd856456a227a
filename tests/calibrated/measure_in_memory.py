"""A test-only measurement of calibration maxima on the whole model in memory (transformers, CPU).

The reference the layer-streamed engine is held to as well: a forward pass per sequence, a
pre-hook on every Linear recording the largest |x| entering it, and a cache that records the
largest |K| and |V| handed to it (keys after the rotary embedding, as they enter the KV cache).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from weightsmith import calibration
from weightsmith.checkpoint import Checkpoint


class _RecordingCache(DynamicCache):
    def __init__(self, config, kv: dict[int, list[float]]) -> None:
        super().__init__(config=config)
        self.kv = kv

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = float(key_states.abs().max()), float(value_states.abs().max())
        old = self.kv.get(layer_idx, [0.0, 0.0])
        self.kv[layer_idx] = [max(old[0], k), max(old[1], v)]
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def measure(ckpt_dir: Path, token_ids: list[list[int]]) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """(|K|, |V| maxima per attention module, |x| maximum per Linear module), as `engine.calibrate.measure`."""
    model = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32).eval()
    inputs: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":

            def hook(mod, args, name=name):
                inputs[name] = max(inputs.get(name, 0.0), float(args[0].abs().max()))

            hooks.append(module.register_forward_pre_hook(hook))
    kv_by_layer: dict[int, list[float]] = {}
    with torch.no_grad():
        for seq in token_ids:
            cache = _RecordingCache(model.config, kv_by_layer)
            model(torch.tensor([seq]), past_key_values=cache, use_cache=True)
    for h in hooks:
        h.remove()
    attention = {
        m.layer_idx: name for name, m in model.named_modules() if name.endswith("self_attn") and hasattr(m, "layer_idx")
    }
    kv = {attention[i]: (k, v) for i, (k, v) in kv_by_layer.items()}
    return kv, inputs


def stats_file(ckpt_dir: Path, token_ids: list[list[int]], out: Path, text: str = "stdlib json.decoder") -> Path:
    """Measure and write a statistics file for `ckpt_dir` as `weightsmith calibrate` would."""
    kv, inputs = measure(ckpt_dir, token_ids)
    prov = calibration.Provenance(
        model_fingerprint=calibration.fingerprint(Checkpoint.open(ckpt_dir)),
        tokens=sum(len(s) for s in token_ids),
        sequences=len(token_ids),
        seq_len=max(len(s) for s in token_ids),
        text=text,
        text_sha256="0" * 64,
        activations="original",
    )
    calibration.write(out, calibration.CalibrationStats(prov, kv, inputs))
    return out
