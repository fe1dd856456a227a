"""The tensors against what config.json's architecture implies: every layer there, every shape right.

A checkpoint missing a layer, its embedding or its head, or holding a projection of the wrong size,
passes every file-level check; vLLM then fails to load it, or (a missing tensor it does not
check for) serves weights that were never loaded. For the architectures whose tensors follow from
config fields alone (the Llama family: Llama, Mistral, Qwen2, Qwen3) the expected tensors, norms
and biases included, are stated in `formats.architecture` (which `quantize` reads too) and compared
here; a bias the architecture does not build is an error too (vLLM skips it without a word). Any
other architecture (MoE, multimodal wrappers, speculative drafts with their own names) gets one info
finding saying so, rather than a silent pass. A `model_type` that names another model than a known
`architectures[0]` is an error: the tensors are checked against the class vLLM builds, and
transformers would build the other (beside a class of no known family, the note says so).

Quantized modules are compared by their logical shape (`weight_shape`, or what the declared
format's packing implies), not the packed one.
"""

from __future__ import annotations

from typing import Any

from weightsmith.audit.findings import ERROR, INFO, Finding
from weightsmith.audit.modules import Located, Module, layer_of
from weightsmith.audit.values import SmallReads
from weightsmith.formats.architecture import (
    ARCHITECTURES,
    SHAPE,
    UNEXPECTED_BIAS,
    Architecture,
    config_sizes,
    contradiction,
    first_architecture,
)
from weightsmith.formats.declaration import QuantDeclaration
from weightsmith.io import names


def _actual_shape(
    module: Module, param: str, decl: QuantDeclaration | None, reads: SmallReads
) -> tuple[int, ...] | None:
    """The shape parameter `param` of `module` has as a model parameter (a weight's logical shape); None
    where the module does not hold it or its stored form does not say."""
    if param == names.WEIGHT:
        held = {names.WEIGHT, names.WEIGHT_PACKED} & module.params.keys()
        return logical_shape(module, decl, reads) if held else None
    ref = module.params.get(param)
    return ref.info.shape if ref is not None else None


def logical_shape(module: Module, decl: QuantDeclaration | None, reads: SmallReads) -> tuple[int, ...] | None:
    """The shape the module's weight has as a model parameter; None where the stored form does not say.

    A quantized weight's packing is the quantization family's to check: here only the shape it stands for.
    """
    params = module.params
    shape_ref = params.get(names.WEIGHT_SHAPE)
    if shape_ref is not None:
        if shape_ref.info.dtype.code != "I64" or shape_ref.info.shape != (2,):
            return None
        return tuple(int(v) for v in reads.array(shape_ref.shard, f"{module.name}.{names.WEIGHT_SHAPE}"))
    if not module.quantized:
        weight = params.get(names.WEIGHT)
        return weight.info.shape if weight is not None else None
    if decl is None:
        return None
    scheme, _ = decl.resolve(module)
    layout = decl.layout(scheme) if scheme is not None else None
    codes = params.get(layout.codes) if layout is not None else None
    if layout is None or codes is None or len(codes.info.shape) != 2:
        return None
    rows, cols = codes.info.shape
    in_features = layout.in_features(cols)
    return None if in_features is None else (rows, in_features)


def check_architecture(
    config: dict[str, Any] | None,
    decl: QuantDeclaration | None,
    modules: dict[str, Module],
    tensors: dict[str, Located],
    reads: SmallReads,
    unreadable: int = 0,
) -> tuple[list[Finding], str]:
    """A config whose model_type and architectures contradict each other, missing layers and tensors,
    layers beyond the config, shapes the config contradicts, and biases the architecture does not build.

    With `unreadable` shards (their headers already an error) a tensor not seen may lie in one of
    them: nothing is called missing then, and the scope says so.
    """
    config = config or {}
    problem = contradiction(config)
    found, scope = _against_family(config, decl, modules, tensors, reads, unreadable, problem)
    if problem is not None and first_architecture(config) in ARCHITECTURES:
        found.insert(0, Finding("arch.contradiction", ERROR, problem, "config.json"))
    return found, scope


def _against_family(
    config: dict[str, Any],
    decl: QuantDeclaration | None,
    modules: dict[str, Module],
    tensors: dict[str, Located],
    reads: SmallReads,
    unreadable: int,
    problem: str | None,
) -> tuple[list[Finding], str]:
    """`check_architecture` by `architectures[0]`'s family (the class vLLM builds). Nothing is checked
    against a class of no known family, so the note saying so also names `problem`, a model_type that
    contradicts it (`contradiction`)."""
    arch_name = first_architecture(config)
    family = ARCHITECTURES.get(arch_name or "")
    if arch_name is None or family is None:
        what = f"architecture {arch_name}" if arch_name else "no architectures in config.json"
        also = f"; and config.json's {problem}" if problem else ""
        return [
            Finding(
                "arch.not-checked",
                INFO,
                f"{what}: no expectations for its tensors, so missing layers and shapes were not checked "
                f"(checked for {', '.join(ARCHITECTURES)}){also}",
                "config.json",
            )
        ], f"{what}: not checked"
    values, bad = config_sizes(config)
    if bad is not None and config.get(bad) is None:
        return [
            Finding(
                "arch.not-checked",
                INFO,
                f"has no {bad}, so the layers and shapes of {arch_name} were not checked against it",
                "config.json",
            )
        ], f"{arch_name}: config.json has no {bad}, not checked"
    if bad is not None:
        return [
            Finding(
                "arch.config",
                ERROR,
                f"{bad} is {config.get(bad)!r}, not a positive integer; the runtime sizes {arch_name} by it",
                "config.json",
            )
        ], f"{arch_name}: config.json's {bad} is not a size"
    count = values["num_hidden_layers"]
    by_layer: dict[int, str] = {}  # each layer's first tensor
    for name in tensors:
        layer = layer_of(name)
        if layer is not None:
            by_layer.setdefault(layer, name)
    present = sorted(n for n in by_layer if n < count)
    # the expectation is built for the layers present only: num_hidden_layers is a stranger's number
    arch = Architecture(arch_name, family, config, values)
    expected = arch.tensors(present)
    found = [
        Finding(
            "arch.missing-tensor", ERROR, f"is missing: {arch_name} loads it, and nothing else holds it", None, name
        )
        for name in expected
        if name not in tensors and not _stored_quantized(name, tensors) and not unreadable
    ]
    missing = _gaps(present, count) if not unreadable else []
    if missing:
        layers = _plural(missing, "layer")
        found.append(
            Finding(
                "arch.missing-layer",
                ERROR,
                f"{layers} {_ranges(missing)} of the {count:,} that num_hidden_layers declares "
                f"{'hold' if layers == 'layers' else 'holds'} no tensors; the runtime would have nothing to load "
                "into them",
                "config.json",
            )
        )
    beyond = _spans(sorted(n for n in by_layer if n >= count))
    if beyond:
        first = by_layer[beyond[0][0]]
        found.append(
            Finding(
                "arch.extra-layer",
                ERROR,
                f"belongs to {_plural(beyond, 'layer')} {_ranges(beyond)} beyond the {count:,} that "
                "num_hidden_layers declares; the runtime has no such layer",
                tensors[first].shard,
                first,
            )
        )
    for name, want in expected.items():
        module_name, param = names.split(name)
        module = modules.get(module_name)
        actual = _actual_shape(module, param, decl, reads) if module is not None else None
        if module is not None and actual is not None and actual != want.shape:
            main = module.params.get(param) or module.params.get(names.WEIGHT) or module.params[names.WEIGHT_PACKED]
            found.append(
                Finding(
                    SHAPE,
                    ERROR,
                    f"is {list(actual)} but config.json implies {list(want.shape)} for {arch_name} ({want.why})",
                    main.shard,
                    name,
                )
            )
    found += [
        Finding(UNEXPECTED_BIAS, ERROR, why, ref.shard, name)
        for name, ref in tensors.items()
        if name.endswith(names.BIAS) and (why := arch.unbuilt_bias(name)) is not None
    ]
    head = "head tied to the embedding" if arch.tied else "lm_head"
    scope = (
        f"{arch_name}: {count:,} layers (norms and biases too), embedding, norm and {head} against config.json's sizes"
    )
    if unreadable:
        scope += f" (shapes only: {unreadable} shard(s) unreadable, so missing tensors were not looked for)"
    return found, scope


def _gaps(present: list[int], count: int) -> list[tuple[int, int]]:
    """The ranges (first, last) of 0..count-1 that `present` (sorted, all below count) leaves out."""
    gaps: list[tuple[int, int]] = []
    expect = 0
    for layer in [*present, count]:
        if layer > expect:
            gaps.append((expect, layer - 1))
        expect = layer + 1
    return gaps


def _spans(layers: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct numbers as runs (first, last)."""
    spans: list[tuple[int, int]] = []
    for n in layers:
        if spans and spans[-1][1] == n - 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    return spans


def _ranges(spans: list[tuple[int, int]], shown: int = 8) -> str:
    """`1, 3-5, 9` (at most `shown` spans, then how many more)."""
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:shown])
    return text + (f" and {len(spans) - shown:,} more ranges" if len(spans) > shown else "")


def _plural(spans: list[tuple[int, int]], word: str) -> str:
    return word if len(spans) == 1 and spans[0][0] == spans[0][1] else word + "s"


def _stored_quantized(name: str, tensors: dict[str, Located]) -> bool:
    """A weight stored in a quantized form under another parameter name (`weight_packed`)."""
    module, param = names.split(name)
    return param == names.WEIGHT and f"{module}.{names.WEIGHT_PACKED}" in tensors
