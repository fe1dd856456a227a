"""`serve.linear-kernel`: a config group whose Linears this vLLM build has no kernel for.

vLLM turns each compressed-tensors config group into one of its scheme classes
(`CompressedTensorsConfig._get_scheme_from_parts`), and each scheme class picks its kernel from one
table of `kernels/linear/__init__.py`, by platform (`kernels.py` reads them). A build for a platform
the table has no kernel for (vLLM's CPU build and NVFP4, say) fails while loading the first Linear
of that group. Which class a group becomes is written out here, once (`vllm_scheme`), for the groups
our schemes write and their near variants; the tables and what their kernels accept are read from
the source, so a build that adds a kernel reads as serving it.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightsmith.audit.modules import Module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import DeclaredGroup, QuantDeclaration, read_declaration
from weightsmith.io import names
from weightsmith.preflight import kernels
from weightsmith.preflight.code import Evidence, missing
from weightsmith.preflight.report import LOAD, Item, Side, unread
from weightsmith.preflight.source import VllmSource
from weightsmith.schemes.mx import SCALE_DTYPE as MX_SCALE_DTYPE

CHECK = "serve.linear-kernel"
#: The kernel tables of `kernels/linear/__init__.py` the scheme classes below pick from.
NVFP4, MXFP4, MXFP8 = "_POSSIBLE_NVFP4_KERNELS", "_POSSIBLE_MXFP4_KERNELS", "_POSSIBLE_MXFP8_KERNELS"
FP8, FP8_BLOCK, WFP8A16 = "_POSSIBLE_FP8_KERNELS", "_POSSIBLE_FP8_BLOCK_KERNELS", "_POSSIBLE_WFP8A16_KERNELS"
INT8, MIXED = "_POSSIBLE_INT8_KERNELS", "_POSSIBLE_KERNELS"
#: Formats `is_activation_quantization_format` (compressed_tensors/utils.py) admits to the W8A8 branches.
_ACTIVATION_FORMATS = (ct.NAIVE_QUANTIZED, ct.INT_QUANTIZED, ct.FLOAT_QUANTIZED, ct.NVFP4_PACK_QUANTIZED)
#: The most modules a finding names.
_NAMED = 3


@dataclass(frozen=True)
class Choice:
    """The scheme class vLLM builds for a group and the table its kernel comes from."""

    scheme: str
    table: str
    #: For the mixed-precision table: the `scalar_types` name the scheme asks a kernel to take.
    weight_type: str | None = None
    #: The predicate that picks the scheme only on a GPU of one exact capability (`_is_fp8_w4a8_sm90`).
    exact_capability: str | None = None
    #: The keyword argument vLLM builds the class with for this group (`use_a16`), if any.
    keyword: str | None = None


def vllm_scheme(s: DeclaredGroup) -> Choice | None:
    """What `_get_scheme_from_parts` builds for group `s`, taking its branches in their order, or None
    for a group this check does not map (it then says nothing of it).

    Weight-only integer groups become `CompressedTensorsWNA16` with weight type `uint<bits>b<bias>`
    (symmetric) or `uint<bits>` (asymmetric: a zero point), as its `WNA16_SUPPORTED_TYPES_MAP` and
    `WNA16_ZP_SUPPORTED_TYPES_MAP` say.
    """
    a = s.activations
    weights = (s.weight_type, s.num_bits, s.strategy, s.group_size)
    if weights == ("float", 4, "tensor_group", 16) and s.symmetric:  # `_is_nvfp4_format`
        if a is None:
            return Choice("CompressedTensorsW4A4Fp4", NVFP4, keyword="use_a16")
        nvfp4_inputs = (a.type, a.num_bits, a.strategy) == ("float", 4, "tensor_group")
        return Choice("CompressedTensorsW4A4Fp4", NVFP4) if nvfp4_inputs else None
    if weights == ("float", 4, "group", 32) and s.symmetric:  # `_is_mxfp4`
        fp8_inputs = a is not None and (a.type, a.num_bits, a.dynamic) == ("float", 8, True)
        return None if fp8_inputs else Choice("CompressedTensorsW4A4Mxfp4", MXFP4)  # W4A8Mxfp4: not mapped
    if weights == ("float", 8, "group", 32) and s.symmetric and s.scale_dtype == MX_SCALE_DTYPE:  # `_is_mxfp8`
        return Choice("CompressedTensorsW8A8Mxfp8", MXFP8)
    if (
        weights[:3] == ("int", 4, "group")
        and s.symmetric
        and a is not None
        and (a.type, a.num_bits, a.strategy, a.dynamic, a.symmetric) == ("float", 8, "token", True, True)
    ):  # `_is_fp8_w4a8_sm90`
        return Choice("CompressedTensorsW4A8Fp8", MIXED, exact_capability="_is_fp8_w4a8_sm90")
    if s.weight_type == "int" and s.strategy in ("channel", "group") and s.num_bits and a is None:
        if s.format != ct.PACK_QUANTIZED:
            return None
        bits = s.num_bits
        weight_type = f"uint{bits}b{2 ** (bits - 1)}" if s.symmetric else f"uint{bits}"
        return Choice("CompressedTensorsWNA16", MIXED, weight_type)
    if s.format not in _ACTIVATION_FORMATS or not s.symmetric:
        return None
    if s.weight_type == "float" and s.num_bits == 8 and s.strategy in ("tensor", "channel", "block"):
        if a is None:  # `_is_fp8_w8a16`
            return Choice("CompressedTensorsW8A16Fp8", WFP8A16)
        if a.type == "float" and (a.dynamic is True or (a.symmetric and a.strategy == "tensor")):  # `_is_fp8_w8a8`
            # block weights quantize activations per group: the block table (`init_fp8_linear_kernel`)
            return Choice("CompressedTensorsW8A8Fp8", FP8_BLOCK if s.strategy == "block" else FP8)
        return None
    int8 = s.weight_type == "int" and s.num_bits == 8 and s.strategy in ("tensor", "channel")
    if int8 and a is not None and a.num_bits == 8 and (a.strategy, a.dynamic) in (("tensor", False), ("token", True)):
        return Choice("CompressedTensorsW8A8Int8", INT8)  # static per-tensor or dynamic per-token inputs
    return None


@dataclass(frozen=True)
class Verdict:
    """Whether the build has a kernel for a choice: True, False (with vLLM's lines), None (a fact it
    needs was not found: `why` says which)."""

    served: bool | None
    evidence: tuple[Evidence, ...] = ()
    why: str = ""


def kernel_for(src: VllmSource, choice: Choice) -> Verdict:
    """Whether this build (its `platform`) has a kernel that can take `choice`, read from its source.

    On a platform without a device capability (CPU), a scheme gated on an exact GPU capability is
    never built: no branch after it takes such a group, so loading raises "No compressed-tensors
    compatible scheme". Elsewhere that depends on the GPU, so nothing is said.
    """
    platform = src.platform
    built = kernels.returned(src, choice.scheme, choice.keyword)
    if built is None:
        return Verdict(None, why=missing(src, kernels.SCHEME_PARTS, f"_get_scheme_from_parts building {choice.scheme}"))
    if choice.exact_capability is not None:
        if platform != "cpu":
            return Verdict(True)
        gate = kernels.exact_capability_gate(src, choice.exact_capability)
        if gate is None:
            test = f"{choice.exact_capability} asking _check_scheme_supported(match_exact=True)"
            return Verdict(None, why=missing(src, kernels.SCHEME_PARTS, test))
        return Verdict(
            False,
            (built, *gate),
            f"vLLM builds {choice.scheme} for it only on a GPU of one exact compute capability "
            f"({choice.exact_capability}); this CPU build has none, no other scheme takes the group, and loading "
            'raises NotImplementedError ("No compressed-tensors compatible scheme was found")',
        )
    entry = kernels.platform_entry(src, choice.table, platform)
    if entry is None:
        return Verdict(None, why=missing(src, kernels.KERNELS, choice.table))
    name = kernels.PLATFORM_ENUM[platform]
    if not entry.kernels:
        return Verdict(
            False,
            (built, entry.evidence),
            f"vLLM builds it as {choice.scheme}, which takes its kernel from {choice.table}, and that lists none for "
            f"PlatformEnum.{name}: loading fails to find a kernel for the first of these Linears",
        )
    if choice.weight_type is None:
        return Verdict(True)
    # Every other gate of a kernel's `can_implement` (an AMD Zen CPU for Zentorch, the activation
    # dtype) only narrows what it takes: a type no kernel lists is refused whatever the machine.
    accepts = [kernels.weight_types(src, k) for k in entry.kernels]
    if any(a is not None and choice.weight_type in a.types for a in accepts):
        return Verdict(True)
    if any(a is None for a in accepts):  # tested through a function (Machete's, Marlin's query): not read
        unreadable = ", ".join(k for k, a in zip(entry.kernels, accepts, strict=True) if a is None)
        takes = "takes" if "," not in unreadable else "take"
        return Verdict(None, why=f"which weight types {unreadable} {takes} cannot be read (no tuple in can_implement)")
    listed = tuple(dict.fromkeys(a.evidence for a in accepts if a is not None))
    takes = "; ".join(f"{a.kernel}: {', '.join(sorted(a.types))}" for a in accepts if a is not None)
    return Verdict(
        False,
        (built, entry.evidence, *listed),
        f"vLLM builds it as {choice.scheme} with weight type {choice.weight_type}, and no kernel {choice.table} "
        f"lists for PlatformEnum.{name} takes that type ({takes}): loading fails to find a kernel",
    )


def check_linear_kernels(src: VllmSource, side: Side) -> list[Item]:
    """A `will not load` finding for each compressed-tensors group covering Linears this build has no
    kernel for, and a `could not check` one where a fact it needs is not in the source (the build's
    platform, a table, the scheme class)."""
    decl = side.decl
    if decl is None or decl.method != ct.QUANT_METHOD:
        return []
    covered = _covered(decl, side)
    items = []
    for scheme in decl.schemes:
        modules = covered.get(scheme.name)
        choice = vllm_scheme(scheme) if modules else None
        if modules is None or choice is None:
            continue
        group = f"config group {scheme.name!r} ({_modules_words(modules)})"
        file, tensor = side.module_file(modules[0]), modules[0].name
        if src.platform not in kernels.PLATFORM_ENUM:  # the tables are keyed by platform: nothing can be read
            why = "the build's platform not found: no vllm-*.dist-info/METADATA beside the package names it"
            return [unread(CHECK, f"whether this build has a kernel for {group}", why, file, tensor)]
        verdict = kernel_for(src, choice)
        if verdict.served:
            continue
        if verdict.served is None:
            items.append(unread(CHECK, f"whether this build has a kernel for {group}", verdict.why, file, tensor))
            continue
        items.append(
            Item(
                CHECK,
                LOAD,
                f"{group}: {verdict.why}",
                _fix(src, scheme),
                verdict.evidence,
                file=file,
                tensor=tensor,
            )
        )
    return items


def _covered(decl: QuantDeclaration, side: Side) -> dict[str, list[Module]]:
    """Config group name -> the Linears it quantizes (ignored ones left out; routed experts too, which
    vLLM builds as FusedMoE: `moe_kernel` checks those)."""
    covered: dict[str, list[Module]] = {}
    for module in side.modules.values():
        if not module.linear_like or names.is_routed_expert(module.name):
            continue
        scheme, ignored = decl.resolve(module)
        if scheme is not None and not ignored:
            covered.setdefault(scheme.name, []).append(module)
    return covered


def _modules_words(modules: list[Module]) -> str:
    names = ", ".join(m.name for m in modules[:_NAMED])
    more = f" and {len(modules) - _NAMED} more" if len(modules) > _NAMED else ""
    return f"{len(modules)} Linear(s): {names}{more}"


def _fix(src: VllmSource, scheme: DeclaredGroup) -> str:
    served = served_schemes(src)
    if not served:
        return "serve this checkpoint on a build for another platform"
    near = sorted(served, key=lambda name: served[name] != scheme.num_bits)  # the same weight width first
    return f"quantize these modules with a scheme this build has a kernel for: {', '.join(near)}"


def served_schemes(src: VllmSource) -> dict[str, int | None]:
    """Our scheme names this build has a kernel for (-> their weight width), in registration order:
    each scheme's own config group, read back and mapped as a checkpoint's would be."""
    from weightsmith.schemes import REGISTRY, make_scheme  # the writers, only when a fix is needed

    found: dict[str, int | None] = {}
    for name in REGISTRY:
        decl = read_declaration({"quantization_config": make_scheme(name).quantization_config([])}, None)
        group = decl.schemes[0] if decl is not None and decl.schemes else None
        choice = vllm_scheme(group) if group is not None else None
        if group is not None and choice is not None and kernel_for(src, choice).served:
            found[name] = group.num_bits
    return found
