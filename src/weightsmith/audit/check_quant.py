"""The quantization config against the tensors.

For every Linear-like module: is it stored the way the config says (quantized when targeted, dense
when ignored), does a quantized module carry exactly the tensors its format needs, with the dtypes
and mutually consistent shapes the runtime allocates, do the shards of a fused layer (q/k/v,
gate/up) agree, since vLLM loads them as one layer with one scheme, and does each layer stored in
FP8 blocks have the shape vLLM builds such a layer with.
"""

from __future__ import annotations

from weightsmith.audit import coverage as cov
from weightsmith.audit.findings import ERROR, INFO, WARNING, Finding, Severity
from weightsmith.audit.modules import Located, Module
from weightsmith.audit.values import SmallReads
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import MODELOPT, DeclaredGroup, QuantDeclaration
from weightsmith.formats.layouts import Layout, Tensor
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE


def check_quantization(
    decl: QuantDeclaration | None, modules: dict[str, Module], reads: SmallReads
) -> tuple[list[Finding], str]:
    """Findings, and a few words on what was compared."""
    linear = [m for m in modules.values() if m.linear_like]
    if decl is None:
        found = [
            _finding(
                m,
                "quant.undeclared",
                ERROR,
                "is stored quantized but config.json declares no quantization_config; loaders will treat it as dense",
            )
            for m in linear
            if m.quantized
        ]
        return found, f"{len(linear):,} Linear-like modules; config.json declares no quantization"
    found = declaration_findings(decl)
    for module in linear:
        found += _module_findings(decl, module, reads)
    found += _fused_findings(decl, linear, reads)
    found += _block_shape_findings(decl, linear)
    found += _precedence_findings(decl, linear)
    formats = ", ".join(sorted({s.format for s in decl.schemes if s.format})) or "no weight format"
    return found, f"{len(linear):,} Linear-like modules against {decl.method} {formats} ({decl.source})"


def declaration_findings(decl: QuantDeclaration) -> list[Finding]:
    """What the declaration itself says is wrong (`quant.config-invalid`: a loader refuses it) or
    left unchecked (`quant.unchecked`: what the tensors could not be compared with)."""
    found = [Finding("quant.config-invalid", ERROR, p.message, p.file) for p in decl.problems]
    unchecked = []
    if decl.unread_method is not None:
        unchecked.append(
            f"quant_method {decl.unread_method} is not one the doctor checks; its tensors were not compared with it"
        )
    if decl.class_targets:
        unchecked.append(
            f"targets {list(decl.class_targets)} may be class names other than Linear, which tensor names cannot "
            "reveal; each was matched as an exact module name only"
        )
    for group in decl.undescribed:
        if decl.method == MODELOPT:
            unchecked.append(f"ModelOpt quant_algo {group.format!r} is not one the doctor checks tensor by tensor")
        else:
            unchecked.append(
                f"format {group.format!r} of group {group.name!r} is not one the doctor checks tensor by tensor"
            )
    return found + [Finding("quant.unchecked", INFO, message, CONFIG_FILE) for message in unchecked]


def _main_param(module: Module) -> str:
    """The parameter that holds the weight (packed or not), which findings about a module name."""
    for param in (names.WEIGHT_PACKED, names.WEIGHT):
        if param in module.params:
            return param
    return next(iter(module.params))


def _main(module: Module) -> Located:
    return module.params[_main_param(module)]


def _finding(module: Module, check: str, severity: Severity, message: str, param: str | None = None) -> Finding:
    """A finding on `module.param` (the main weight by default), in the shard that holds it."""
    param = param or _main_param(module)
    shard = (module.params.get(param) or _main(module)).shard
    return Finding(check, severity, message, shard, f"{module.name}.{param}")


def _describe(scheme: DeclaredGroup) -> str:
    return f"config group {scheme.name!r} ({scheme.format})"


def _module_findings(decl: QuantDeclaration, module: Module, reads: SmallReads) -> list[Finding]:
    scheme, ignored = decl.resolve(module)
    status = cov.status(module, scheme is not None, ignored)
    if status == cov.MISSED:
        assert scheme is not None  # a module is missed only when a scheme targets it
        dtype = _main(module).info.dtype.code
        return [
            _finding(
                module,
                "quant.not-quantized",
                ERROR,
                f"is targeted by {_describe(scheme)} but stored dense ({dtype}); quantize it or add it to ignore",
            )
        ]
    if status == cov.QUANTIZED_IGNORED:
        return [
            _finding(
                module,
                "quant.ignored-but-quantized",
                ERROR,
                "is stored quantized but the config's ignore list names it, so the runtime expects a dense weight",
            )
        ]
    if status == cov.QUANTIZED_UNTARGETED:
        return [
            _finding(
                module,
                "quant.not-targeted",
                ERROR,
                "is stored quantized but no config group targets it, so the runtime expects a dense weight",
            )
        ]
    if (
        status == cov.NOT_TARGETED
        and module.lm_head
        and decl.method == ct.QUANT_METHOD
        and any("Linear" in s.targets for s in decl.schemes)
    ):
        return [
            _finding(
                module,
                "quant.lm-head-not-ignored",
                WARNING,
                "is an nn.Linear in transformers, which the target 'Linear' then covers; "
                "add 'lm_head' to ignore (vLLM keeps it dense either way)",
            )
        ]
    if status != cov.QUANTIZED or scheme is None:
        return []
    layout = decl.layout(scheme)
    if layout is None:
        return []
    return _tensor_set_findings(module, scheme, layout.dtypes()) + _shape_findings(scheme, layout, module, reads)


def _tensor_set_findings(module: Module, scheme: DeclaredGroup, expected: dict[str, str | None]) -> list[Finding]:
    found = []
    for param, dtype in expected.items():
        located = module.params.get(param)
        if located is None:
            message = f"is missing: {_describe(scheme)} needs it for every quantized module"
            found.append(_finding(module, "quant.missing-param", ERROR, message, param))
            continue
        code = located.info.dtype.code
        allowed = frozenset({dtype}) if dtype else scheme.scale_dtypes
        if code not in allowed:
            want = (
                "a float dtype (the original weight's)"
                if allowed == ct.ORIGINAL_FLOATS
                else " or ".join(sorted(allowed))
            )
            found.append(
                _finding(module, "quant.param-dtype", ERROR, f"is {code} but {_describe(scheme)} stores {want}", param)
            )
    if names.WEIGHT not in expected and names.WEIGHT in module.params:
        found.append(
            _finding(
                module,
                "quant.leftover-weight",
                ERROR,
                f"is left over beside the quantized tensors of {_describe(scheme)}; delete it",
                names.WEIGHT,
            )
        )
    for param in sorted((names.QUANTIZED_MARKERS & module.params.keys()) - expected.keys()):
        found.append(
            _finding(
                module,
                "quant.unexpected-param",
                WARNING,
                f"is not part of {_describe(scheme)}; the runtime has no parameter to load it into",
                param,
            )
        )
    return found


def _shape_findings(scheme: DeclaredGroup, layout: Layout, module: Module, reads: SmallReads) -> list[Finding]:
    expected, problems = _expected_shapes(layout, module, reads)
    found = [_finding(module, "quant.param-shape", ERROR, message, param) for param, message in problems]
    for param, tensor in expected.items():
        located = module.params.get(param)
        if located is None:
            continue
        actual = located.info.shape
        if tensor.scalar:
            if located.info.numel != 1:
                found.append(
                    _finding(
                        module,
                        "quant.param-shape",
                        ERROR,
                        f"has shape {list(actual)} but must hold exactly one value",
                        param,
                    )
                )
        elif actual != tensor.shape:
            found.append(
                _finding(
                    module,
                    "quant.param-shape",
                    ERROR,
                    f"has shape {list(actual)} but {_describe(scheme)} implies {list(tensor.shape)}",
                    param,
                )
            )
    return found


def _expected_shapes(
    layout: Layout, module: Module, reads: SmallReads
) -> tuple[dict[str, Tensor], list[tuple[str, str]]]:
    """The layout's tensors for the logical shape the main tensor (and `weight_shape`'s values) imply."""
    main_param = names.WEIGHT_PACKED if names.WEIGHT_PACKED in module.params else names.WEIGHT
    main = module.params.get(main_param)
    if main is None:
        return {}, []
    if len(main.info.shape) != 2:
        return {}, [(main_param, f"has shape {list(main.info.shape)}; a quantized Linear weight is two-dimensional")]
    out, cols = main.info.shape
    in_features = layout.in_features(cols)
    if in_features is None:
        return _pack_quantized_shapes(layout, module, reads, out, cols)
    return layout.tensors(out, in_features), []


def _pack_quantized_shapes(
    layout: Layout, module: Module, reads: SmallReads, out: int, cols: int
) -> tuple[dict[str, Tensor], list[tuple[str, str]]]:
    """pack-quantized: `weight_shape` holds the input count, which int32 words round up."""
    shape_ref = module.params.get(names.WEIGHT_SHAPE)
    if shape_ref is None or shape_ref.info.dtype.code != "I64" or shape_ref.info.shape != (2,):
        return {names.WEIGHT_SHAPE: layout.tensors(out, 0)[names.WEIGHT_SHAPE]}, []
    rows, in_features = (int(v) for v in reads.array(shape_ref.shard, f"{module.name}.{names.WEIGHT_SHAPE}"))
    expected = layout.tensors(out, in_features)
    need = expected.pop(layout.codes).shape[1]
    problems = []
    if rows != out:
        problems.append((names.WEIGHT_SHAPE, f"says {rows} output rows but weight_packed has {out}"))
    if cols != need:
        bits = layout.code_bits
        problems.append((layout.codes, f"has {cols} int32 columns but {in_features} inputs at {bits} bits need {need}"))
    return expected, problems


def _precedence_findings(decl: QuantDeclaration, linear: list[Module]) -> list[Finding]:
    """One warning per pair of groups that vLLM and compressed-tensors resolve some modules to differently.

    compressed-tensors quantized each module with the group its precedence picks (exact names
    before regexes); vLLM loads it with the first target in config order. Where they differ, the
    weights were written for one scheme and are read as another.
    """
    by_module = {m.name: m for m in linear}
    pairs: dict[tuple[str, str], list[str]] = {}
    for module, ours, theirs in decl.precedence_conflicts(list(by_module)):
        pairs.setdefault((ours, theirs), []).append(module)
    found = []
    for (ours, theirs), modules in pairs.items():
        more = f" (and {len(modules) - 1:,} more modules)" if len(modules) > 1 else ""
        found.append(
            _finding(
                by_module[modules[0]],
                "quant.group-precedence",
                WARNING,
                f"is resolved to config group {ours!r} by vLLM (first matching target in config order) but to "
                f"{theirs!r} by compressed-tensors (exact names before regexes){more}; name each module in one "
                "group only",
            )
        )
    return found


def _fused_findings(decl: QuantDeclaration, linear: list[Module], reads: SmallReads) -> list[Finding]:
    groups: dict[str, list[Module]] = {}
    for module in linear:
        partners = names.fused_partners(module.name)
        if partners is not None:
            groups.setdefault(partners[0], []).append(module)
    found = []
    for fused, members in groups.items():
        if len(members) < 2:
            continue
        storage = {m.name: _storage(m) for m in members}
        if len(set(storage.values())) > 1:
            detail = "; ".join(f"{names.leaf(m)} {s}" for m, s in storage.items())
            found.append(
                _finding(
                    members[0],
                    "quant.fused-mismatch",
                    ERROR,
                    f"and its partners in {names.leaf(fused)} are stored differently ({detail}); "
                    "vLLM loads them as one layer and refuses mixed schemes",
                )
            )
            continue
        found += _global_scale_findings(fused, members, reads)
    return found


def _block_shape_findings(decl: QuantDeclaration, linear: list[Module]) -> list[Finding]:
    """One error per layer stored in compressed-tensors blocks that vLLM refuses to build at load.

    Only compressed-tensors is held to the rule (`ct.block_shape_refusal`): vLLM lets an HF `fp8`
    checkpoint's fused layers straddle blocks. A layer whose shards are stored differently is
    `quant.fused-mismatch`'s. Routed experts are left out: vLLM builds them into a FusedMoE layer,
    which has a rule of its own (`validate_fp8_block_shape_moe`).
    """
    if decl.method != ct.QUANT_METHOD:
        return []
    layers: dict[str, list[tuple[Module, tuple[int, int]]]] = {}
    for module in linear:
        scheme, ignored = decl.resolve(module)
        block = scheme.block if scheme is not None and scheme.strategy == "block" else None
        if (
            block is not None
            and module.quantized
            and not ignored
            and len(_main(module).info.shape) == 2
            and names.expert_layer(module.name) is None
        ):
            layers.setdefault(names.linear_layer(module.name)[0], []).append((module, block))
    found = []
    for layer, members in layers.items():
        blocks = {block for _, block in members}
        if len(blocks) != 1:
            continue
        block = blocks.pop()
        order = names.linear_layer(members[0][0].name)[1]
        shards = sorted((m for m, _ in members), key=lambda m: order.index(m.name))
        refused = ct.block_shape_refusal(layer, [(m.name, _main(m).info.shape[0]) for m in shards], block)
        if refused is not None:
            culprit = next(m for m in shards if m.name == refused[0])
            found.append(
                _finding(
                    culprit,
                    "quant.block-shape",
                    ERROR,
                    f"is quantized, but {refused[1]}; keep {names.leaf(layer)} dense",
                )
            )
    return found


def _storage(module: Module) -> str:
    main = _main(module)
    kind = "quantized" if module.quantized else "dense"
    return f"{kind} {main.info.dtype.code}"


def _global_scale_findings(fused: str, members: list[Module], reads: SmallReads) -> list[Finding]:
    for param in (names.WEIGHT_GLOBAL_SCALE, names.WEIGHT_SCALE_2):
        located = [loc for m in members if (loc := m.params.get(param)) is not None]
        if len(located) < len(members) or any(loc.info.numel != 1 or loc.info.dtype.code != "F32" for loc in located):
            continue
        values = [reads.scalar(loc.shard, f"{m.name}.{param}") for m, loc in zip(members, located, strict=True)]
        if len(set(values)) > 1:
            shown = ", ".join(f"{names.leaf(m.name)} {v:g}" for m, v in zip(members, values, strict=True))
            return [
                _finding(
                    members[0],
                    "quant.fused-global-scale",
                    WARNING,
                    f"{param} differs across the shards of {names.leaf(fused)} ({shown}); "
                    "vLLM uses one value for the fused layer, so the others dequantize off scale",
                    param,
                )
            ]
    return []
