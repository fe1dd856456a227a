"""`serve.moe-backend` and `serve.moe-router`: routed experts, which vLLM builds as FusedMoE, not Linears.

A model's FusedMoE layer asks the quantization config for a MoE method (compressed-tensors'
`get_moe_method`: WNA16, W8A8-Int8, W8A8-FP8, NVFP4, or the unquantized method for experts a config
ignores), and the method asks its oracle (`fused_moe/oracle/<kind>.py`) for a backend: the oracle's
priority list names backends, `backend_to_kernel_cls` maps each to experts classes, and each class's
`_supports_current_device` says whether it runs here. When no candidate does, loading raises the
oracle's own error. On vLLM CPU 0.32 every quantized-expert class needs AMX tiles, so a CPU without
them serves BF16 experts only. Which method a group becomes is written out once (`_ORACLES`, keyed by
the linear scheme class `vllm_scheme` maps it to); the candidates, the classes and their gates are
read from the source (`device_gate`), so a build that adds a CPU kernel reads as serving it.

The router is the other CPU limit: vLLM CPU routes every FusedMoE layer through `CPURouter`, whose
path for ungrouped routing asserts softmax scoring; the model file says which scoring function the
family's layer passes (Laguna: sigmoid), and the first request dies on that assert.
"""

from __future__ import annotations

import ast
import platform as host
from dataclasses import dataclass

from weightsmith.audit.modules import Module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.preflight import code, kernels
from weightsmith.preflight.code import Evidence, _evidence, missing
from weightsmith.preflight.device_gate import Gates, Machine, Truth
from weightsmith.preflight.linear_kernel import _modules_words, vllm_scheme
from weightsmith.preflight.report import LOAD, NOTE, Item, Side, unread
from weightsmith.preflight.source import VllmSource

BACKEND, ROUTER, ONE_SCHEME = "serve.moe-backend", "serve.moe-router", "serve.moe-one-scheme"
FUSED_MOE = "vllm/model_executor/layers/fused_moe"
MOE_METHOD = (
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py"
)
CPU_ROUTER = f"{FUSED_MOE}/router/cpu_router.py"
#: The FusedMoE constructors a model file builds its experts with.
_MOE_LAYERS = ("FusedMoE", "SharedFusedMoE", "FusedMoEFactory")
#: What FusedMoE takes when a model passes nothing: softmax over all experts, no custom function.
_ROUTING_DEFAULTS = {"scoring_func": "softmax", "use_grouped_topk": False, "custom_routing_function": None}


@dataclass(frozen=True)
class Oracle:
    """One MoE method's backend oracle: its file, its backend enum and its selection function."""

    method: str
    kind: str
    enum: str
    select: str

    @property
    def rel(self) -> str:
        return f"{FUSED_MOE}/oracle/{self.kind}.py"


#: compressed-tensors' `get_moe_method`, keyed by the linear scheme class the same group becomes.
_ORACLES = {
    "CompressedTensorsWNA16": Oracle("CompressedTensorsWNA16MoEMethod", "int_wna16", "WNA16MoEBackend",
                                     "select_wna16_moe_backend"),
    "CompressedTensorsW8A8Int8": Oracle("CompressedTensorsW8A8Int8MoEMethod", "int8", "Int8MoeBackend",
                                        "select_int8_moe_backend"),
    "CompressedTensorsW8A8Fp8": Oracle("CompressedTensorsW8A8Fp8MoEMethod", "fp8", "Fp8MoeBackend",
                                       "select_fp8_moe_backend"),
    "CompressedTensorsW4A4Fp4": Oracle("CompressedTensorsW4A4Nvfp4MoEMethod", "nvfp4", "NvFp4MoeBackend",
                                       "select_nvfp4_moe_backend"),
}  # fmt: skip
UNQUANTIZED = Oracle("UnquantizedFusedMoEMethod", "unquantized", "UnquantizedMoeBackend",
                     "select_unquantized_moe_backend")  # fmt: skip


def machine_here(src: VllmSource, flags: frozenset[str] | None) -> Machine:
    """This machine as vLLM's gates see it: the build's platform, the CPU's flags and architecture, and
    whether a `zentorch` package sits beside vLLM."""
    return Machine(src.platform, flags, host.machine().lower(), src.zentorch)


# ---- experts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether some candidate experts class runs here (None: not read), the classes and their gates."""

    served: bool | None
    candidates: tuple[tuple[str, Truth], ...] = ()
    evidence: tuple[Evidence, ...] = ()
    said: str | None = None
    why: str = ""


def experts_verdict(src: VllmSource, oracle: Oracle, machine: Machine) -> Verdict:
    """Whether any experts class `oracle` may pick on `machine` runs there, read from the source."""
    gates = Gates(src, machine)
    parsed = src.parsed(oracle.rel)
    if parsed is None:
        return Verdict(None, why=missing(src, oracle.rel))
    tree, lines = parsed
    select = _function(tree, oracle.select)
    if select is None:
        return Verdict(None, why=missing(src, oracle.rel, oracle.select))
    backends = _candidates(gates, oracle, tree, select)
    if backends is None:
        return Verdict(None, why=missing(src, oracle.rel, f"the backends {oracle.select} tries on this platform"))
    classes = _kernel_classes(tree, oracle.enum)
    seen: dict[str, Truth] = {}
    evidence: list[Evidence] = []
    for backend in backends:
        if backend not in classes:
            return Verdict(None, why=missing(src, oracle.rel, f"backend_to_kernel_cls for {oracle.enum}.{backend}"))
        for cls in classes[backend]:
            if cls in seen:
                continue
            gate = gates.predicate(oracle.rel, cls, "_supports_current_device")
            if gate is None:
                return Verdict(None, why=missing(src, oracle.rel, f"{cls}._supports_current_device"))
            seen[cls], where, func = gate
            at = seen[cls].at or (where, _last_return(func).lineno)
            at_lines = src.parsed(at[0])
            if at_lines is not None and at[1] <= len(at_lines[1]):
                line = Evidence(at[0], at[1], at_lines[1][at[1] - 1].strip())
                evidence += [line] if line not in evidence else []
    if any(t.value for t in seen.values()):
        return Verdict(True, tuple(seen.items()))
    unread_one = next((f"{c}: {t.unread}" for c, t in seen.items() if t.value is None), None)
    if unread_one is not None:
        return Verdict(None, tuple(seen.items()), why=f"whether this experts class runs here ({unread_one})")
    said, raised = _refusal(gates, oracle, tree, lines, select)
    return Verdict(False, tuple(seen.items()), tuple(evidence) + raised, said)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _candidates(gates: Gates, oracle: Oracle, tree: ast.Module, select: ast.FunctionDef) -> list[str] | None:
    """The backends the selection may try on this platform, in the order they are first named: from
    the priority function it calls (its branches for other platforms skipped), else from the list it
    builds itself. Order does not decide here: a backend is refused only if none of them runs."""
    called = {n.func.id for n in ast.walk(select) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    priority = next((_function(tree, name) for name in sorted(called) if "priority" in name), None)
    if priority is not None:
        return _members_on_path(gates, oracle, priority.body)
    lists = [
        n.value
        for n in select.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.List) and _enum_members(n.value, oracle.enum)
    ]
    return _enum_members(lists[0], oracle.enum) if lists else None


def _members_on_path(gates: Gates, oracle: Oracle, body: list[ast.stmt]) -> list[str] | None:
    """The enum members the statements name on this platform's path through their `if` branches."""
    found: list[str] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef):
            continue
        if isinstance(stmt, ast.If):
            test = gates.expr(oracle.rel, stmt.test, {}, 0)
            # a test not read (the config's, a backend's own): both branches' backends are candidates
            branches = [stmt.body, stmt.orelse] if test.value is None else [stmt.body if test.value else stmt.orelse]
            for branch in branches:
                inner = _members_on_path(gates, oracle, branch)
                if inner is None:
                    return None
                found += [m for m in inner if m not in found]
                if test.value is not None and branch and isinstance(branch[-1], ast.Return):
                    return found
            continue
        found += [m for m in _enum_members(stmt, oracle.enum) if m not in found]
        if isinstance(stmt, ast.Return):
            return found
    return found


def _enum_members(node: ast.AST, enum: str) -> list[str]:
    members: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == enum:
            members += [n.attr] if n.attr not in members else []
    return members


def _kernel_classes(tree: ast.Module, enum: str) -> dict[str, list[str]]:
    """`backend_to_kernel_cls`: backend -> the experts classes its branch returns."""
    func = _function(tree, "backend_to_kernel_cls")
    table: dict[str, list[str]] = {}
    if func is None:
        return table
    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        backends = _enum_members(node.test, enum)
        returned = next((s for s in node.body if isinstance(s, ast.Return)), None)
        if not backends or returned is None or not isinstance(returned.value, ast.List):
            continue
        names = [e.id for e in returned.value.elts if isinstance(e, ast.Name)]
        for backend in backends:
            table.setdefault(backend, names)
    return table


def _last_return(func: ast.FunctionDef) -> ast.stmt:
    returns = [n for n in ast.walk(func) if isinstance(n, ast.Return)]
    return returns[-1] if returns else func


def _refusal(
    gates: Gates, oracle: Oracle, tree: ast.Module, lines: list[str], select: ast.FunctionDef
) -> tuple[str | None, tuple[Evidence, ...]]:
    """vLLM's own words when no backend runs: the selection's last `raise` where this platform reaches
    it, else (the selection returns `NONE` here) the oracle's `Unsupported ... backend` raise for it."""
    for stmt in reversed(select.body):
        if isinstance(stmt, ast.Raise):
            return _message(stmt), (_evidence(oracle.rel, lines, stmt),)
        if isinstance(stmt, ast.If) and any(isinstance(s, ast.Raise) for s in stmt.body):
            test = gates.expr(oracle.rel, stmt.test, {}, 0)
            if test.value:
                raised = next(s for s in stmt.body if isinstance(s, ast.Raise))
                return _message(raised), (_evidence(oracle.rel, lines, raised),)
            continue
        if isinstance(stmt, ast.Return):
            continue
        break
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and (text := _message(node)) and text.startswith("Unsupported"):
            return text.replace("{…}", "NONE"), (_evidence(oracle.rel, lines, node),)
    return None, ()


def _message(node: ast.Raise) -> str | None:
    exc = node.exc
    if not isinstance(exc, ast.Call) or not exc.args:
        return None
    arg = exc.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{…}" for v in arg.values)
    return None


def _routed(side: Side) -> list[tuple[Module, str | None]]:
    """Each routed-expert Linear with the config group that quantizes it (None: unquantized or ignored)."""
    decl = side.decl
    found = []
    for module in side.modules.values():
        if names.is_routed_expert(module.name) and module.linear_like:
            scheme, ignored = decl.resolve(module) if decl is not None else (None, True)
            found.append((module, None if scheme is None or ignored else scheme.name))
    return found


def check_one_scheme(src: VllmSource, side: Side, routed: list[tuple[Module, str | None]]) -> list[Item]:
    """A `will not load` finding for a MoE layer whose first expert's projections resolve to different
    config groups (one quantized, one ignored, say): vLLM fuses them into one FusedMoE and its
    `get_moe_method` refuses to build it."""
    layers: dict[str, dict[str | None, list[Module]]] = {}
    for module, group in routed:
        prefix, _, rest = module.name.partition(".experts.")
        if rest.startswith("0."):
            layers.setdefault(prefix, {}).setdefault(group, []).append(module)
    mixed = {prefix: groups for prefix, groups in layers.items() if len(groups) > 1}
    if not mixed:
        return []
    prefix, groups = next(iter(mixed.items()))
    raised = _first_raise(src)
    if raised is None:
        why = missing(src, MOE_METHOD, "get_moe_method")
        return [unread(ONE_SCHEME, "what vLLM does with experts of mixed schemes", why)]
    said, evidence = raised
    split = "; ".join(
        f"{', '.join(m.name.rpartition('.')[2] for m in modules)} "
        + (f"in config group {group!r}" if group is not None else "unquantized")
        for group, modules in groups.items()
    )
    first = next(iter(groups.values()))[0]
    return [
        Item(
            ONE_SCHEME,
            LOAD,
            f"{len(mixed)} MoE layer(s) hold experts whose projections are quantized differently, e.g. "
            f'{prefix}: {split}; vLLM fuses them into one FusedMoE and refuses to build it ("{said}")',
            "quantize every projection of the experts alike: a group size that divides each of their input widths "
            "(--group-size), or keep them all unquantized",
            (evidence,),
            file=side.module_file(first),
            tensor=first.name,
        )
    ]


def _first_raise(src: VllmSource) -> tuple[str, Evidence] | None:
    """The first `raise` of compressed-tensors' `get_moe_method`: its refusal of mixed projections."""
    found = kernels._function(src, MOE_METHOD, "get_moe_method")
    if found is None:
        return None
    func, lines = found
    raised = next((n for n in ast.walk(func) if isinstance(n, ast.Raise)), None)
    said = _message(raised) if raised is not None else None
    return (said, _evidence(MOE_METHOD, lines, raised)) if raised is not None and said else None


def check_moe_experts(
    src: VllmSource, side: Side, flags: frozenset[str] | None, routed: list[tuple[Module, str | None]]
) -> list[Item]:
    """On a CPU build, a `will not load` finding for each kind of routed experts no backend of it runs
    on this machine; `could not check` where a fact it needs is not in the source."""
    if src.platform != "cpu":  # which backend runs on a GPU depends on the GPU; `moe.w4a4-backend` covers that
        return []
    groups: dict[str | None, list[Module]] = {}
    for module, group in routed:
        groups.setdefault(group, []).append(module)
    decl = side.decl
    machine = machine_here(src, flags)
    items: list[Item] = []
    for name, modules in groups.items():
        oracle = UNQUANTIZED
        if name is not None:
            scheme = next(s for s in decl.schemes if s.name == name) if decl is not None else None
            choice = vllm_scheme(scheme) if scheme is not None else None
            if choice is None or choice.scheme not in _ORACLES:
                continue  # a group `get_moe_method` is not mapped for here: nothing said, as for Linears
            oracle = _ORACLES[choice.scheme]
        what = f"routed experts, {_modules_words(modules)}"
        if name is not None:
            what += f" of config group {name!r}"
        file, tensor = side.module_file(modules[0]), modules[0].name
        verdict = experts_verdict(src, oracle, machine)
        if verdict.served and oracle is UNQUANTIZED:
            continue
        if verdict.served:  # a class runs here; its `_supports_quant_scheme` (the keys it takes) is not read
            running = ", ".join(cls for cls, t in verdict.candidates if t.value)
            items.append(
                Item(
                    BACKEND,
                    NOTE,
                    f"{what}: vLLM builds them as FusedMoE with {oracle.method}; on this machine {running} runs, and "
                    "whether it takes these experts' quantization (its `_supports_quant_scheme`) is decided when "
                    "vLLM loads them, not read here",
                    file=file,
                    tensor=tensor,
                )
            )
            continue
        if verdict.served is None:
            items.append(unread(BACKEND, f"whether a MoE backend of this build runs {what}", verdict.why, file, tensor))
            continue
        needs = "; ".join(f"{cls} needs {' and '.join(t.needs)}" for cls, t in verdict.candidates)
        said = f' ("{verdict.said}")' if verdict.said else ""
        items.append(
            Item(
                BACKEND,
                LOAD,
                f"{what}: vLLM builds them as FusedMoE with {oracle.method}, and no experts class its "
                f"{oracle.kind} oracle may pick runs on this machine ({needs}): loading fails{said}",
                "keep the routed experts unquantized (a recipe rule that leaves `mlp.experts` out) or serve on a "
                "machine where one of these classes runs",
                verdict.evidence,
                file=file,
                tensor=tensor,
            )
        )
    return items


# ---- router -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Routing:
    """What a model file passes FusedMoE about routing, and where."""

    values: dict[str, object]
    evidence: Evidence


def model_routing(src: VllmSource, side: Side) -> tuple[str, Routing] | None:
    """(vLLM architecture, what its model file's first FusedMoE call passes about routing), read with
    the checkpoint's config for `getattr(config, "k", default)` and `config.k`; None where the file or
    such a call is not found or a value is not a constant or a config read."""
    entries = code.registry_entries(src)
    for arch in side.architectures:
        if arch not in entries or not code._MODULE.fullmatch(entries[arch][0]):
            continue
        rel = code.model_file(src, entries[arch][0])
        parsed = src.parsed(rel)
        if parsed is None:
            return None
        tree, lines = parsed
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _callee(node.func) in _MOE_LAYERS:
                values = dict(_ROUTING_DEFAULTS)
                for kw in node.keywords:
                    if kw.arg in values:
                        value = _config_value(kw.value, side)
                        if value is _NOT_READ:
                            return None
                        values[kw.arg] = value
                return arch, Routing(values, _evidence(rel, lines, node))
        return None
    return None


_NOT_READ = object()


def _callee(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _config_value(node: ast.expr, side: Side) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) in (2, 3)
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        default = _config_value(node.args[2], side) if len(node.args) == 3 else None
        found = side.get(node.args[1].value)
        return default if found is None else found
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and "config" in node.value.id:
        found = side.get(node.attr)
        return _NOT_READ if found is None else found
    if isinstance(node, ast.Name) and node.id == "None":
        return None
    return "given" if isinstance(node, ast.Name | ast.Attribute | ast.Lambda) else _NOT_READ


def check_moe_router(src: VllmSource, side: Side) -> list[Item]:
    """On vLLM CPU, a `will not load` finding for a family whose FusedMoE routing `CPURouter` asserts
    against: the server reports ready, then its first request dies."""
    if src.platform != "cpu" or not any(names.is_routed_expert(m.name) for m in side.modules.values()):
        return []
    routing = model_routing(src, side)
    if routing is None:
        arch = side.architectures[0] if side.architectures else "(none in config.json)"
        why = (
            f"no FusedMoE call read in the model file vLLM's registry names for {arch}, or a routing value it "
            "passes is neither a constant nor read from the config"
        )
        return [unread(ROUTER, "whether vLLM CPU's router takes this model's routing", why)]
    arch, found = routing
    router = _cpu_branch(src, found.values)
    if router is None:
        return [unread(ROUTER, "whether vLLM CPU's router takes this model's routing",
                       missing(src, CPU_ROUTER, "CPURouter._compute_routing"))]  # fmt: skip
    assert_line, takes = router
    if takes:
        return []
    scoring = found.values["scoring_func"]
    return [
        Item(
            ROUTER,
            LOAD,
            f"{arch} routes its experts with scoring_func={scoring!r} and no expert groups ({found.evidence.show()}); "
            "vLLM CPU routes every FusedMoE layer in CPURouter, whose path for that asserts softmax scoring: the "
            "server reports ready, then the first request dies with an AssertionError",
            "serve this model on a GPU build; vLLM CPU has no router for its scoring function",
            (found.evidence, assert_line),
        )
    ]


def _cpu_branch(src: VllmSource, values: dict[str, object]) -> tuple[Evidence, bool] | None:
    """The `assert self.scoring_func == ...` of `CPURouter._compute_routing` on the branch `values` take,
    and whether it holds; (the method's line, True) when that branch asserts nothing. None: not read."""
    found = kernels._function(src, CPU_ROUTER, "_compute_routing")
    if found is None:
        return None
    func, lines = found
    body: list[ast.stmt] = func.body
    while body:
        stmt = next((s for s in body if isinstance(s, ast.If)), None)
        if stmt is None:
            break
        test = _router_test(stmt.test, values)
        if test is None:
            return None
        if test:
            body = stmt.body
            break
        body = stmt.orelse
    for line in body:
        if isinstance(line, ast.Assert):
            held = _router_test(line.test, values)
            if held is None:
                continue
            return _evidence(CPU_ROUTER, lines, line), held
    return _evidence(CPU_ROUTER, lines, func), True


def _router_test(node: ast.expr, values: dict[str, object]) -> bool | None:
    """A test on `self.<routing attribute>`: truthiness, `== constant`, `is None`, `is not None`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return bool(values[node.attr]) if node.attr in values else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _router_test(node.operand, values)
        return None if inner is None else not inner
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left = node.left
        if not (isinstance(left, ast.Attribute) and isinstance(left.value, ast.Name) and left.value.id == "self"):
            return None
        if left.attr not in values or not isinstance(node.comparators[0], ast.Constant):
            return None
        have, want, op = values[left.attr], node.comparators[0].value, node.ops[0]
        if isinstance(op, ast.Eq | ast.Is):
            return have == want
        if isinstance(op, ast.NotEq | ast.IsNot):
            return have != want
    return None


def check_moe(src: VllmSource, side: Side, flags: frozenset[str] | None) -> list[Item]:
    """Every MoE check, in the order vLLM meets them: building each FusedMoE's method (one scheme per
    layer), its backend, then routing the first request."""
    routed = _routed(side)
    found: list[Item] = []
    if routed and (side.decl is None or side.decl.method == ct.QUANT_METHOD):  # compressed-tensors' groups
        found = check_one_scheme(src, side, routed) or check_moe_experts(src, side, flags, routed)
    return found + check_moe_router(src, side)
