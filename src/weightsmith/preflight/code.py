"""What vLLM's source does, found by parsing it with `ast`: each answer carries the file, the line
and the line itself, so a user can open the file and see it.

Detection is by what the code does, not by version numbers: a call to a quant-config method no
class in the config's hierarchy defines, a `.weight` read of a Linear outside any guard, a cache
hash that does (or does not) fold in the draft's model config, MoE backends that set the
activation scales to None. A patched installation therefore reads as patched.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from weightsmith.preflight.source import VllmSource

MODELS = "vllm/model_executor/models"
QUANTIZATION = "vllm/model_executor/layers/quantization"
REGISTRY = f"{MODELS}/registry.py"
#: Where `method_to_config` maps a `quant_method` to its config class.
QUANT_TABLE = f"{QUANTIZATION}/__init__.py"
SPECULATIVE = "vllm/config/speculative.py"
MODEL_CONFIG = "vllm/config/model.py"
ENVS = "vllm/envs.py"
NVFP4_MOE = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"
#: The proposer code each method runs besides the draft's model file.
PROPOSERS = {"dflash": ("vllm/v1/spec_decode/dflash.py",), "eagle3": ("vllm/v1/spec_decode/eagle.py",)}
#: How vLLM's EAGLEConfig renames a draft's architecture before asking the registry (prefix, suffix test).
ARCH_PREFIX = {"dflash": "DFlash", "eagle3": "Eagle3", "eagle": "Eagle"}
#: Exceptions whose handler makes a missing attribute harmless.
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_GUARD_WORDS = ("hasattr", "getattr", "UnquantizedLinearMethod", "quant_method", "except")
_CATCHES = {"AttributeError", "Exception", "BaseException", "NotImplementedError"}


@dataclass(frozen=True)
class Evidence:
    """One line of vLLM's source: where it is and what it says."""

    file: str
    line: int
    text: str

    def show(self) -> str:
        return f"{self.file.rpartition('/')[2]}:{self.line}: {self.text}"

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "text": self.text}


def parses(src: VllmSource, rel: str) -> bool:
    """Whether `rel` exists and is Python `ast` can parse (else its checks cannot be made)."""
    return src.parsed(rel) is not None


def missing(src: VllmSource, rel: str, symbol: str | None = None) -> str:
    """Why a fact read from `rel` (or from `symbol` in it) was not found, for a `could not check`
    finding: the file is not there, it does not parse, or it holds no such symbol."""
    if src.text(rel) is None:
        return f"{rel} not found"
    if src.parsed(rel) is None:
        return f"{rel} does not parse"
    return f"{symbol or 'what it reads'} not found in {rel}"


def _evidence(rel: str, lines: list[str], node: ast.AST) -> Evidence:
    line = getattr(node, "lineno", 1)
    return Evidence(rel, line, lines[line - 1].strip() if line <= len(lines) else "")


def _guard_evidence(rel: str, lines: list[str], guard: ast.AST) -> Evidence:
    """The line of a (possibly multi-line) guard that says what it tests."""
    first = getattr(guard, "lineno", 1)
    last = getattr(guard, "end_lineno", None) or first
    for line in range(first, min(last, len(lines)) + 1):
        if any(word in lines[line - 1] for word in _GUARD_WORDS):
            return Evidence(rel, line, lines[line - 1].strip())
    return _evidence(rel, lines, guard)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
    found = []
    while node in parents:
        node = parents[node]
        found.append(node)
    return found


# ---- which file vLLM loads the draft from -------------------------------------------------------


def registry_entries(src: VllmSource) -> dict[str, tuple[str, Evidence]]:
    """The model registry: architecture -> (module, the line registering it); empty where `REGISTRY` is
    missing, does not parse, or holds no such table (a layout preflight does not know)."""
    parsed = src.parsed(REGISTRY)
    if parsed is None:
        return {}
    tree, lines = parsed
    entries: dict[str, tuple[str, Evidence]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and isinstance(value, ast.Tuple)
                and value.elts
                and isinstance(value.elts[0], ast.Constant)
                and isinstance(value.elts[0].value, str)
            ):
                entries.setdefault(key.value, (value.elts[0].value, _evidence(REGISTRY, lines, key)))
    return entries


def draft_model_file(
    entries: dict[str, tuple[str, Evidence]], src: VllmSource, architectures: list[str], method: str
) -> tuple[str, str, Evidence] | None:
    """(vLLM architecture, model file, registry line) for the draft among the registry's `entries`,
    renamed as EAGLEConfig renames it."""
    prefix = ARCH_PREFIX.get(method)
    for arch in architectures:
        name = arch if prefix is None or arch.startswith(prefix) or arch.endswith(prefix) else prefix + arch
        if name in entries and _MODULE.fullmatch(entries[name][0]):
            module, ev = entries[name]
            return name, model_file(src, module), ev
    return None


def model_file(src: VllmSource, module: str) -> str:
    """The file of a module the model registry names (`llama` -> `vllm/model_executor/models/llama.py`);
    a package's `__init__.py` when there is no such `.py` (which a missing file also reads as)."""
    dotted = module if module.startswith("vllm.") else f"{MODELS.replace('/', '.')}.{module}"
    return src.module_file(dotted) or dotted.replace(".", "/") + "/__init__.py"


def import_origin(src: VllmSource, rel: str, name: str) -> tuple[str, str] | None:
    """(file, name there) that `name` in `rel` is imported from: `from vllm.x import y [as name]` or
    `from .x import y`, at the top of `rel` or inside a function (vLLM imports there too), the first
    found; None when `rel` imports no such name from a file of this installation."""
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    for node in ast.walk(parsed[0]):  # breadth first: a module-level import before a function's own
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        alias = next((a for a in node.names if (a.asname or a.name) == name), None)
        if alias is None:
            continue
        module = node.module
        if node.level:
            module = f"{rel.rsplit('/', node.level)[0].replace('/', '.')}.{module}"
        origin = src.module_file(module)
        if origin is not None:
            return origin, alias.name
    return None


# ---- the quant config a draft's layers are built with ---------------------------------------------

#: The helper vLLM's draft model files build their layers' quant config with (`models/utils.py`).
DRAFT_QUANT_CONFIG = "get_draft_quant_config"


@dataclass(frozen=True)
class DraftQuantConfig:
    """Where a model file builds its layers with a quant config of the draft's own, and the line that makes
    that config: `VllmConfig.get_quantization_config`, never given the model's `packed_modules_mapping`."""

    call: Evidence
    made: Evidence


def draft_quant_config(src: VllmSource, rel: str) -> DraftQuantConfig | None:
    """The draft's own quant config in `rel`, or None: no call of DRAFT_QUANT_CONFIG there, its definition
    not found, or a definition that hands the config a `packed_modules_mapping` (then fused layers resolve
    as the target's do)."""
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    tree, lines = parsed
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n) == DRAFT_QUANT_CONFIG), None)
    origin = import_origin(src, rel, DRAFT_QUANT_CONFIG)
    defined = src.parsed(origin[0]) if origin is not None else None
    if call is None or origin is None or defined is None:
        return None
    func = next((n for n in defined[0].body if isinstance(n, ast.FunctionDef) and n.name == origin[1]), None)
    if func is None or "packed_modules_mapping" in ast.unparse(func):
        return None
    makes = (n for n in ast.walk(func) if isinstance(n, ast.Call) and _called(n) == "get_quantization_config")
    made = next(makes, func)
    return DraftQuantConfig(_evidence(rel, lines, call), _evidence(origin[0], defined[1], made))


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


# ---- quant-config methods the model file calls ----------------------------------------------------


@dataclass(frozen=True)
class QuantCall:
    """A call `...quant_config.METHOD(...)` in a model file."""

    method: str
    evidence: Evidence
    #: The line of the guard (hasattr test, try) that keeps a missing method harmless, if any.
    guard: Evidence | None

    @property
    def guarded(self) -> bool:
        return self.guard is not None


def quant_config_class(src: VllmSource, quant_method: str) -> str | None:
    """The class vLLM builds for a `quant_method` (its `method_to_config` table), or None."""
    parsed = src.parsed(QUANT_TABLE)
    if parsed is None:
        return None
    for node in ast.walk(parsed[0]):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == quant_method and isinstance(value, ast.Name):
                    return value.id
    return None


def class_defines(src: VllmSource, cls: str, method: str) -> bool | None:
    """Whether `cls` or a base class under vLLM's quantization package defines `method` (None: class not found).

    Only the files that define a class of the hierarchy are parsed (the package has over a hundred).
    """
    first = _find_class(src, cls)
    if first is None:
        return None
    seen: set[str] = set()
    todo: list[ast.ClassDef] = [first]
    while todo:
        node = todo.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        defined |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if method in defined:
            return True
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            found = _find_class(src, name) if name else None
            if found is not None:
                todo.append(found)
    return False


def _find_class(src: VllmSource, name: str) -> ast.ClassDef | None:
    """The top-level class `name` in vLLM's quantization package, or None."""
    pattern = re.compile(rf"^class {re.escape(name)}\b", re.MULTILINE)
    for rel in src.files(QUANTIZATION):
        text = src.text(rel)
        if text is None or not pattern.search(text):
            continue
        parsed = src.parsed(rel)
        for node in parsed[0].body if parsed else []:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
    return None


def quant_config_calls(src: VllmSource, rel: str) -> list[QuantCall]:
    """Every `quant_config.METHOD(...)` call in `rel`, and whether a guard keeps a missing METHOD harmless."""
    return [QuantCall(*use) for use in _guarded_uses(src, rel, _quant_config_method, _hasattr_guard)]


def _quant_config_method(node: ast.AST) -> str | None:
    """METHOD when `node` is a call `quant_config.METHOD(...)` (or `x.quant_config.METHOD(...)`)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    if (isinstance(owner, ast.Name) and owner.id == "quant_config") or (
        isinstance(owner, ast.Attribute) and owner.attr == "quant_config"
    ):
        return node.func.attr
    return None


def _guarded_uses(
    src: VllmSource,
    rel: str,
    use: Callable[[ast.AST], str | None],
    guard_for: Callable[[str], Callable[[ast.AST], bool]],
) -> list[tuple[str, Evidence, Evidence | None]]:
    """(name, its line, its guard's line) for every node of `rel` that `use` names; the guard is the
    one around it whose test `guard_for(name)` accepts, None when nothing guards it."""
    parsed = src.parsed(rel)
    if parsed is None:
        return []
    tree, lines = parsed
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        name = use(node)
        if name is None:
            continue
        guard = _guard(node, parents, guard_for(name))
        evidence = _guard_evidence(rel, lines, guard) if guard is not None else None
        found.append((name, _evidence(rel, lines, node), evidence))
    return found


def _hasattr_guard(method: str) -> Callable[[ast.AST], bool]:
    """A test that asks whether the quant config has `method` before calling it."""
    return partial(_mentions_attr, attr=method)


def _mentions_attr(test: ast.AST, attr: str) -> bool:
    """`hasattr(x, "attr")` or `getattr(x, "attr", ...)` somewhere in an `if` test."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in ("hasattr", "getattr")
        and any(isinstance(a, ast.Constant) and a.value == attr for a in n.args)
        for n in ast.walk(test)
    )


def _guard(node: ast.AST, parents: dict[ast.AST, ast.AST], guard_test: Callable[[ast.AST], bool]) -> ast.AST | None:
    """The guard around `node`: an `if`/conditional whose test passes `guard_test`, or a `try` that
    catches AttributeError; None when nothing guards it.

    The test of an `if` guards its body, and an earlier operand of `and` guards the later ones
    (`hasattr(q, "m") and q.m()`), so the node's own expression counts too.
    """
    chain = [node, *_ancestors(node, parents)]
    for child, anc in itertools.pairwise(chain):
        if isinstance(anc, ast.If | ast.IfExp | ast.While) and child is not anc.test and guard_test(anc.test):
            return anc.test
        if isinstance(anc, ast.BoolOp) and isinstance(anc.op, ast.And):
            before = anc.values[: anc.values.index(child)] if child in anc.values else []
            for value in before:
                if guard_test(value):
                    return value
        if isinstance(anc, ast.Try) and child in anc.body:
            for handler in anc.handlers:
                names = (
                    ([handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts)
                    if handler.type is not None
                    else []
                )
                if handler.type is None or any(getattr(n, "id", None) in _CATCHES for n in names):
                    return handler
    return None


# ---- direct weight reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightRead:
    """A read of `<module>.weight` of a Linear (`qkv_proj`, `fc`, ...), outside or inside a guard."""

    module: str
    evidence: Evidence
    #: The line of the quantization check the read sits behind, if any.
    guard: Evidence | None


def _is_linear_name(name: str) -> bool:
    return name.endswith("_proj") or name in ("fc", "lm_head")


def _quant_guard(test: ast.AST) -> bool:
    """A test that asks whether the layer is quantized: its quant method, or whether it has a `weight`."""
    for n in ast.walk(test):
        if isinstance(n, ast.Name) and n.id in ("UnquantizedLinearMethod", "quant_config"):
            return True
        if isinstance(n, ast.Attribute) and n.attr in ("quant_method", "UnquantizedLinearMethod", "quant_config"):
            return True
    return _mentions_attr(test, "weight")


def weight_reads(src: VllmSource, rel: str) -> list[WeightRead]:
    """Every `X.<linear>.weight` in `rel`, and whether it sits behind a quantization guard."""
    return [WeightRead(*use) for use in _guarded_uses(src, rel, _linear_weight_read, lambda _: _quant_guard)]


def _linear_weight_read(node: ast.AST) -> str | None:
    """The Linear's name when `node` reads `X.<linear>.weight`."""
    if (
        isinstance(node, ast.Attribute)
        and node.attr == "weight"
        and isinstance(node.value, ast.Attribute)
        and _is_linear_name(node.value.attr)
        and isinstance(node.ctx, ast.Load)
    ):
        return node.value.attr
    return None


# ---- modules built without the quant config ------------------------------------------------------

#: vLLM layer classes that take a `quant_config` keyword: built without it they hold a plain `weight`.
QUANTIZABLE_LAYERS = ("VocabParallelEmbedding", "ParallelLMHead")


@dataclass(frozen=True)
class PlainBuild:
    """`self.<module> = VocabParallelEmbedding(...)` (or ParallelLMHead) with no `quant_config`."""

    module: str
    evidence: Evidence


def plain_builds(src: VllmSource, rel: str) -> list[PlainBuild]:
    """Every embedding or LM head `rel` builds without passing a quant config."""
    parsed = src.parsed(rel)
    if parsed is None:
        return []
    tree, lines = parsed
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in QUANTIZABLE_LAYERS:
            continue
        keyword = next((k for k in node.value.keywords if k.arg == "quant_config"), None)
        if keyword is not None and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute):
                found.append(PlainBuild(target.attr, _evidence(rel, lines, node.value)))
    return found


# ---- compile cache ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileKey:
    """Whether compiled graphs are keyed on the draft's model config (its quantization included)."""

    keyed: bool | None
    evidence: tuple[Evidence, ...]
    #: When `keyed` is None: the fact that was not found (`code.missing`).
    missing: str = ""


def compile_key(src: VllmSource) -> CompileKey:
    """Read `SpeculativeConfig.compute_hash`: does it fold in `draft_model_config.compute_hash()`, and does
    `ModelConfig.compute_hash` leave `quantization` among its factors? None when either is not found."""
    spec = _method(src, SPECULATIVE, "SpeculativeConfig", "compute_hash")
    if spec is None:
        return CompileKey(None, (), missing(src, SPECULATIVE, "SpeculativeConfig.compute_hash"))
    node, lines = spec
    head = _evidence(SPECULATIVE, lines, node)
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "compute_hash"
            and isinstance(call.func.value, ast.Attribute)
            and call.func.value.attr == "draft_model_config"
        ):
            ev = _evidence(SPECULATIVE, lines, call)
            model = _method(src, MODEL_CONFIG, "ModelConfig", "compute_hash")
            if model is None:
                return CompileKey(None, (ev,), missing(src, MODEL_CONFIG, "ModelConfig.compute_hash"))
            if _ignores(model[0], "quantization"):
                return CompileKey(False, (ev, _evidence(MODEL_CONFIG, model[1], model[0])))
            return CompileKey(True, (ev,))
    return CompileKey(False, (head,))


def _method(src: VllmSource, rel: str, cls: str, name: str) -> tuple[ast.FunctionDef, list[str]] | None:
    parsed = src.parsed(rel)
    if parsed is None:
        return None
    tree, lines = parsed
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item, lines
    return None


def _ignores(func: ast.FunctionDef, factor: str) -> bool:
    return any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "ignored_factors" for t in n.targets)
        and any(isinstance(c, ast.Constant) and c.value == factor for c in ast.walk(n.value))
        for n in ast.walk(func)
    )


def cache_root_default(src: VllmSource) -> Evidence | None:
    """The line of `envs.py` that gives `VLLM_CACHE_ROOT` its default."""
    text = src.text(ENVS)
    if text is None:
        return None
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if '"VLLM_CACHE_ROOT"' in line and "lambda" in line:
            return Evidence(ENVS, i, line.strip())
    return None


# ---- NVFP4 MoE backends -------------------------------------------------------------------------


@dataclass(frozen=True)
class MoeBackends:
    """Which NVFP4 MoE backends drop the activation scales, which keep them, and their `--moe-backend` names."""

    drops: dict[str, Evidence]
    keeps: tuple[str, ...]
    flag: dict[str, str]


def nvfp4_moe_backends(src: VllmSource) -> MoeBackends | None:
    """Read the NVFP4 MoE oracle: a backend whose branch of the weight conversion sets `a13_scale = None`
    runs without activation scales (weight-only FP4 numerics)."""
    parsed = src.parsed(NVFP4_MOE)
    if parsed is None:
        return None
    tree, lines = parsed
    members: list[str] = []
    flag: dict[str, str] = {}
    drops: dict[str, Evidence] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "NvFp4MoeBackend":
            members = [
                t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
            ]
        if isinstance(node, ast.FunctionDef) and node.name == "map_nvfp4_backend":
            for d in ast.walk(node):
                if isinstance(d, ast.Dict):
                    for k, v in zip(d.keys, d.values, strict=True):
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Attribute):
                            flag.setdefault(v.attr, str(k.value))
        if isinstance(node, ast.If):
            backends = [
                n.attr
                for n in ast.walk(node.test)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "NvFp4MoeBackend"
            ]
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "a13_scale" for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant)
                    and stmt.value.value is None
                ):
                    for b in backends:
                        drops.setdefault(b, _evidence(NVFP4_MOE, lines, stmt))
    if not members:
        return None
    keeps = tuple(m for m in members if m not in drops and "CUTLASS" in m)
    return MoeBackends(drops, keeps, flag)
