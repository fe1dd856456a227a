"""The input quantization a server applies to a quantized Linear with stored activation scales, for eval.

A W4A4 NVFP4 or static W8A8 FP8 checkpoint is served with each quantized Linear's input quantized
with the scale the checkpoint stores; an eval that multiplies unquantized inputs by the dequantized
weights measures a model nobody serves. Here, for every module whose config group keeps a
calibrated activation scale (`layouts.input_scale`: the layout says which parameter), a function
that fake-quantizes its input as compressed-tensors' `forward_quantize` does (vLLM's kernels compute
the same codes):

- `strategy: tensor_group` with `dynamic: local` (NVFP4): per group of `group_size` inputs along the
  last dimension, a scale `global * amax / qmax` rounded to the scale dtype (FP8 E4M3; 0 becomes
  the dtype's eps), then `x / (scale / global)` rounded to the code grid and multiplied back;
- a static per-tensor scale (`strategy: tensor`, `dynamic: false`): `x / input_scale` clamped,
  rounded to the code grid and multiplied back.

The code grid follows from `type` and `num_bits` (FP4 E2M1, FP8 E4M3, symmetric integers). Nothing
here names a scheme. Dynamic activations (FP8 per token, MX) keep no scale and are not applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from weightsmith.core.errors import CheckpointError
from weightsmith.formats import layouts
from weightsmith.formats.declaration import quantized_modules
from weightsmith.formats.source import TensorReader
from weightsmith.io.checkpoint import CONFIG_FILE, Checkpoint

if TYPE_CHECKING:
    from weightsmith.engine.loading import Loader

#: One module's input fake-quantization: a float32 tensor in, the values the server computes with out.
Quantizer = Callable[[Any], Any]
#: FP8 E4M3's largest finite value and its eps (what compressed-tensors puts in place of a zero scale).
_E4M3_MAX, _E4M3_EPS = 448.0, 0.125
#: (lower edge, E2M1 value, edge included): an edge between two codes belongs to the even one.
_FP4_STEPS = ((0.25, 0.5, False), (0.75, 1.0, True), (1.25, 1.5, False), (1.75, 2.0, True),
              (2.5, 3.0, False), (3.5, 4.0, True), (5.0, 6.0, False))  # fmt: skip


def round_fp4(x: Any) -> Any:
    """`x` rounded to the nearest FP4 E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to the even code."""
    import torch

    a = x.abs()
    out = torch.zeros_like(a)
    for edge, value, inclusive in _FP4_STEPS:
        out = torch.where(a >= edge if inclusive else a > edge, value, out)
    return out * torch.sign(x)


def _grid(args: dict[str, Any], where: str) -> tuple[float, Callable[[Any], Any]]:
    """The largest code and the rounding of already scaled, clamped values to the code grid."""
    import torch

    kind, bits = args.get("type"), args.get("num_bits")
    if kind == "float" and bits == 4:
        return 6.0, round_fp4
    if kind == "float" and bits == 8:
        return _E4M3_MAX, lambda v: v.to(torch.float8_e4m3fn).to(v.dtype)
    if kind == "int" and type(bits) is int and 2 <= bits <= 16 and args.get("symmetric", True):
        return float(2 ** (bits - 1) - 1), torch.round
    raise CheckpointError(
        f"input_activations {kind} {bits}-bit{'' if args.get('symmetric', True) else ' asymmetric'} "
        "is not an input quantization eval can apply",
        file=where,
        code="eval.activations",
    )


def fake_quantizer(args: dict[str, Any], scale: float, where: str = CONFIG_FILE) -> Quantizer:
    """The fake-quantization of an input by `args` (a config group's `input_activations`) and its stored
    `scale`: the global scale under local group scales (`tensor_group`), or the per-tensor scale."""
    import torch

    qmax, rounding = _grid(args, where)
    qmin = -qmax - 1 if args.get("type") == "int" else -qmax
    if args.get("strategy") == "tensor_group":
        group = args.get("group_size")
        if type(group) is not int or group < 1 or args.get("scale_dtype") not in ("torch.float8_e4m3fn", None):
            raise CheckpointError(
                f"input_activations group_size {group!r} / scale_dtype {args.get('scale_dtype')!r} "
                "is not an input quantization eval can apply",
                file=where,
                code="eval.activations",
            )
        fp8_scales = args.get("scale_dtype") is not None
        g = torch.tensor(scale, dtype=torch.float32)

        def grouped(x: Any) -> Any:
            xg = x.unflatten(-1, (-1, group))
            s = g * (xg.abs().amax(-1, keepdim=True) / qmax)
            if fp8_scales:
                s = s.clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).to(s.dtype)
                s = torch.where(s == 0, _E4M3_EPS, s)
            step = s / g
            return (rounding((xg / step).clamp(qmin, qmax)) * step).flatten(-2).to(x.dtype)

        return grouped
    s = torch.tensor(scale, dtype=torch.float32)
    return lambda x: (rounding((x / s).clamp(qmin, qmax)) * s).to(x.dtype)


def input_quantizers(ckpt: Checkpoint) -> dict[str, Quantizer]:
    """Per quantized module whose config group keeps a calibrated activation scale, its input quantization.

    Empty for an original or a checkpoint with dynamic (or no) activation quantization.
    """
    qc = ckpt.quantization_config
    if not isinstance(qc, dict) or not any(
        isinstance(g, dict) and layouts.input_scale(g.get("input_activations"))
        for g in (qc.get("config_groups") or {}).values()
    ):
        return {}
    out: dict[str, Quantizer] = {}
    with TensorReader(ckpt) as reader:
        for qm in quantized_modules(ckpt):
            args = qc["config_groups"][qm.group].get("input_activations")
            param = layouts.input_scale(args)
            if param is None:
                continue
            name = f"{qm.module}.{param}"
            if name not in ckpt.tensors:
                raise CheckpointError(
                    f"is missing: config group {qm.group} quantizes {qm.module}'s input with a stored scale",
                    file=ckpt.root,
                    tensor=name,
                    code="eval.missing-param",
                )
            value = np.asarray(reader.read(name), dtype=np.float32).reshape(-1)
            if value.size != 1 or not np.isfinite(value[0]) or value[0] <= 0:
                raise CheckpointError(
                    f"holds {value[:4].tolist()}, not one positive finite scale",
                    file=ckpt.file_of(name),
                    tensor=name,
                    code="eval.activation-scale",
                )
            out[qm.module] = fake_quantizer(args, float(value[0]), str(ckpt.root / CONFIG_FILE))
    return out


@contextmanager
def quantized_inputs(module: Any, quantizers: dict[str, Quantizer], prefix: str = "") -> Iterator[int]:
    """While inside, every submodule of `module` named in `quantizers` (full names: `prefix` is
    `module`'s own) has its first input fake-quantized; yields how many submodules that is."""
    with _quantizing(module.named_modules(prefix=prefix), quantizers) as count:
        yield count


@contextmanager
def served_inputs(loader: Loader, quantizers: dict[str, Quantizer], index: int | None = None) -> Iterator[int]:
    """While inside, decoder layer `index` of the engine's model (every layer: None; loaded) has every
    Linear named in `quantizers` by its checkpoint name, MoE experts' included (`LinearExperts`), take its
    input fake-quantized as the server quantizes it; yields how many modules that is. transformers' names
    (Laguna's `shared_experts`) and merged experts are no obstacle, as they are to `quantized_inputs`."""
    from weightsmith.engine.experts import LinearExperts

    skeleton = loader.skeleton
    if index is None:  # the layers' list as one scope: one routing for them all, not one per layer
        units, scope, path = range(len(skeleton.layers)), skeleton.layers, skeleton.layers_path
    else:
        units, scope, path = range(index, index + 1), skeleton.layers[index], skeleton.layer_path(index)
    experts = LinearExperts(scope, path, loader.experts)
    linears = {name: module for unit in units for name, module in loader.linears(unit).items()}
    with (
        experts.routing() if any(name in quantizers for name in experts.modules) else nullcontext(),
        _quantizing((linears | experts.modules).items(), quantizers) as count,
    ):
        yield count


@contextmanager
def _quantizing(modules: Iterable[tuple[str, Any]], quantizers: dict[str, Quantizer]) -> Iterator[int]:
    """While inside, each of the (name, module) pairs named in `quantizers` has its first input
    fake-quantized; yields how many that is."""
    handles = []
    for name, module in modules:
        quantize = quantizers.get(name)
        if quantize is not None:
            handles.append(module.register_forward_pre_hook(lambda _m, a, q=quantize: (q(a[0]), *a[1:])))
    try:
        yield len(handles)
    finally:
        for h in handles:
            h.remove()
