"""vLLM's linear-kernel tables, read from its source with `ast`: which kernels each platform has for
each kind of quantized Linear, and which weight types a mixed-precision kernel accepts.

`model_executor/kernels/linear/__init__.py` lists, per kind, the kernels vLLM tries in order on each
platform (`_POSSIBLE_NVFP4_KERNELS = {PlatformEnum.CUDA: [...], ...}`); a platform with no entry,
or an empty one, has no kernel for that kind and the layer fails to load ("Failed to find a kernel
that can implement the ... linear layer"). A mixed-precision kernel says in its `can_implement`
which weight types it takes (`if c.weight_type not in _CPUWNA16_SUPPORTED_QUANT_TYPES`), a tuple of
`scalar_types.NAME` read here, following the name to its assignment, in the class, its module or
the module it was imported from. Anything not written so is "cannot be read", never a guess.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from weightsmith.preflight.code import QUANTIZATION, Evidence, _evidence, import_origin
from weightsmith.preflight.source import VllmSource

KERNELS = "vllm/model_executor/kernels/linear/__init__.py"
SCHEME_PARTS = f"{QUANTIZATION}/compressed_tensors/compressed_tensors.py"
#: `VllmSource.platform` -> the `PlatformEnum` member its tables are keyed by.
PLATFORM_ENUM = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCM", "xpu": "XPU"}


@dataclass(frozen=True)
class Entry:
    """One table's list of kernels for one platform (empty when the table has none for it)."""

    table: str
    kernels: tuple[str, ...]
    #: The platform's entry line, or the table's first line when it has no entry for the platform.
    evidence: Evidence


def platform_entry(src: VllmSource, table: str, platform: str) -> Entry | None:
    """`table`'s kernels for `platform` (a `PLATFORM_ENUM` key), or None when the table is not found."""
    parsed = src.parsed(KERNELS)
    if parsed is None:
        return None
    tree, lines = parsed
    member = PLATFORM_ENUM[platform]
    for node in tree.body:
        if not (isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict)):
            continue
        if table not in (t.id for t in _targets(node) if isinstance(t, ast.Name)):
            continue
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if isinstance(key, ast.Attribute) and key.attr == member and isinstance(value, ast.List | ast.Tuple):
                names = tuple(e.id for e in value.elts if isinstance(e, ast.Name))
                return Entry(table, names, _evidence(KERNELS, lines, key))
        return Entry(table, (), _evidence(KERNELS, lines, node))
    return None


@dataclass(frozen=True)
class Accepts:
    """The weight types (`scalar_types` names) a mixed-precision kernel's `can_implement` admits."""

    kernel: str
    types: frozenset[str]
    #: The line that lists them.
    evidence: Evidence


def weight_types(src: VllmSource, kernel: str) -> Accepts | None:
    """What `kernel` (a class named in `KERNELS`) tests `weight_type` against, or None when its
    `can_implement` does not test it against a tuple or list of `scalar_types.NAME` that can be found."""
    rel = _imported_from(src, KERNELS, kernel)
    found = _class(src, rel, kernel) if rel else None
    if found is None or rel is None:
        return None
    cls, _ = found
    method = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "can_implement"), None)
    if method is None:
        return None
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "weight_type"
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
        ):
            where = node.comparators[0]
            if isinstance(where, ast.Attribute) and isinstance(where.value, ast.Name) and where.value.id == "cls":
                listed = _assigned(src, rel, cls.body, where.attr)
            elif isinstance(where, ast.Name):
                listed = _module_value(src, rel, where.id)
            else:
                return None
            return None if listed is None else Accepts(kernel, *listed)
    return None


def _imported_from(src: VllmSource, rel: str, name: str) -> str | None:
    """The file `name` is imported from in `rel` (`code.import_origin`)."""
    found = import_origin(src, rel, name)
    return found[0] if found is not None else None


def _class(src: VllmSource, rel: str, name: str) -> tuple[ast.ClassDef, list[str]] | None:
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    tree, lines = parsed
    return next(((n, lines) for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _assigned(src: VllmSource, rel: str, body: list[ast.stmt], name: str) -> tuple[frozenset[str], Evidence] | None:
    """The `scalar_types` names assigned to `name` in `body` (a class's or a module's statements)."""
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    for node in body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in _targets(node)):
            value = node.value
            if not isinstance(value, ast.Tuple | ast.List | ast.Set):
                return None
            types = [e.attr for e in value.elts if isinstance(e, ast.Attribute)]
            if len(types) != len(value.elts):
                return None
            return frozenset(types), _evidence(rel, parsed[1], node)
    return None


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _module_value(src: VllmSource, rel: str, name: str) -> tuple[frozenset[str], Evidence] | None:
    """`name` assigned at the top of `rel`, or in the module `rel` imports it from (one step)."""
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    found = _assigned(src, rel, parsed[0].body, name)
    if found is not None:
        return found
    origin = _imported_from(src, rel, name)
    origin_tree = src.parsed(origin) if origin else None
    return _assigned(src, origin, origin_tree[0].body, name) if origin and origin_tree else None


def returned(src: VllmSource, scheme_class: str, keyword: str | None = None) -> Evidence | None:
    """The line of `CompressedTensorsConfig._get_scheme_from_parts` that builds `scheme_class` (with
    the keyword argument `keyword` when named, else without it: `use_a16=True` tells NVFP4A16 from
    NVFP4), or None."""
    found = _function(src, SCHEME_PARTS, "_get_scheme_from_parts")
    if found is None:
        return None
    func, lines = found
    calls = [
        node
        for node in ast.walk(func)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == scheme_class
        and (keyword in (k.arg for k in node.keywords) if keyword else "use_a16" not in (k.arg for k in node.keywords))
    ]
    return _evidence(SCHEME_PARTS, lines, min(calls, key=lambda n: n.lineno)) if calls else None


def exact_capability_gate(src: VllmSource, predicate: str) -> tuple[Evidence, Evidence] | None:
    """Where `predicate` (e.g. `_is_fp8_w4a8_sm90`) asks `_check_scheme_supported(..., match_exact=True)`
    and where that answers `not match_exact` for a platform with no device capability (CPU): such a
    scheme is never chosen there. None when the source does not read so."""
    gate = _function(src, SCHEME_PARTS, predicate)
    check = _function(src, SCHEME_PARTS, "_check_scheme_supported")
    if gate is None or check is None:
        return None
    asked = next(
        (
            n
            for n in ast.walk(gate[0])
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "_check_scheme_supported"
            and any(k.arg == "match_exact" and _is_true(k.value) for k in n.keywords)
        ),
        None,
    )
    answer = next(
        (
            n
            for n in ast.walk(check[0])
            if isinstance(n, ast.Return)
            and isinstance(n.value, ast.UnaryOp)
            and isinstance(n.value.op, ast.Not)
            and isinstance(n.value.operand, ast.Name)
            and n.value.operand.id == "match_exact"
        ),
        None,
    )
    if asked is None or answer is None:
        return None
    return _evidence(SCHEME_PARTS, gate[1], asked), _evidence(SCHEME_PARTS, check[1], answer)


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _function(src: VllmSource, rel: str, name: str) -> tuple[ast.FunctionDef, list[str]] | None:
    """The function or method `name` anywhere in `rel`."""
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    tree, lines = parsed
    return next(((n, lines) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)
