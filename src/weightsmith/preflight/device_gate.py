"""Whether a class or function of vLLM's source answers True on this machine, read without importing it.

vLLM decides which MoE experts class runs from small predicates (`_supports_current_device`):
`current_platform.is_cpu() and current_platform.get_cpu_architecture() == CpuArchEnum.X86 and
torch.cpu._is_amx_tile_supported()`, say. This module evaluates such predicates for a described
machine, in three values: True, False, or None where a fact is out of reach (a call it does not know,
a statement it does not model). It follows module-level functions and class methods a predicate
calls, a few levels deep, through the file's imports, so `is_deep_gemm_supported()` is read from
where it is defined rather than guessed. Every False carries the words of the fact that made it so
("AMX tiles", "a CUDA GPU"), for the finding to say what a class needs.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, replace

from weightsmith.preflight.code import import_origin
from weightsmith.preflight.source import VllmSource

#: How deep calls are followed: vLLM's gates call one or two helpers; a deeper chain is not read.
MAX_DEPTH = 4
#: The platform predicates of vLLM's `Platform` class and the platform each is true on.
_PLATFORM_IS = {
    "is_cpu": ("cpu",),
    "is_cuda": ("cuda",),
    "is_rocm": ("rocm",),
    "is_xpu": ("xpu",),
    "is_tpu": ("tpu",),
    "is_cuda_alike": ("cuda", "rocm"),
}
#: Predicates about a GPU's compute capability: False on a platform without one (CPU).
_CAPABILITY = ("has_device_capability", "is_device_capability", "is_device_capability_family", "supports_mx")
_WORDS = {"cpu": "a CPU", "cuda": "a CUDA GPU", "rocm": "a ROCm GPU", "xpu": "an Intel XPU", "tpu": "a TPU"}
#: `platform.machine()` spellings -> vLLM's `CpuArchEnum` member.
_ARCH = {"x86_64": "X86", "amd64": "X86", "i386": "X86", "i686": "X86", "aarch64": "ARM", "arm64": "ARM"}
_ARCH.update({"ppc64le": "POWERPC", "ppc64": "POWERPC", "s390x": "S390X", "riscv64": "RISCV"})


@dataclass(frozen=True)
class Machine:
    """The machine vLLM would run on, as its gates ask about it."""

    #: vLLM's platform: 'cpu', 'cuda', 'rocm', 'xpu'.
    platform: str
    #: The CPU's flags (/proc/cpuinfo), None where they cannot be told.
    flags: frozenset[str] | None
    #: `platform.machine()`, lower case.
    arch: str
    #: A `zentorch` package installed beside vLLM (its ops registered).
    zentorch: bool = False

    @property
    def cpu_arch(self) -> str | None:
        return _ARCH.get(self.arch)


@dataclass(frozen=True)
class Truth:
    """A predicate's value (None: not read) and, when False, what it would need, in words."""

    value: bool | None
    needs: tuple[str, ...] = ()
    #: What could not be read, in words, when `value` is None.
    unread: str = ""
    #: Where the fact that made it False is asked (file, line): the line a finding cites.
    at: tuple[str, int] | None = None


_UNKNOWN = object()
#: vLLM's probes of a CPU feature -> the /proc/cpuinfo flag that answers them, and the feature in words.
_CPU_FLAGS = {"torch.cpu._is_amx_tile_supported": ("amx_tile", "AMX tiles"), "cpu_has_amx_fp8": ("amx_fp8", "AMX-FP8")}
#: The class vLLM instantiates as `current_platform` on each platform, where its methods are read.
_PLATFORM_CLASS = {"cpu": ("vllm/platforms/cpu.py", "CpuPlatform")}
#: Decorators that leave a predicate's value as it is: how a method is bound, a cache.
_TRANSPARENT = ("staticmethod", "classmethod", "property", "cache", "lru_cache", "functools.cache",
                "functools.lru_cache", "abstractmethod", "abc.abstractmethod")  # fmt: skip


@dataclass(frozen=True)
class ClassRef:
    """A class a predicate holds in a name (`cls`, or what `cls.get_clses()` returns)."""

    rel: str
    name: str


@dataclass(frozen=True)
class Wrapped:
    """The function a decorator's wrapper calls through its parameter."""

    rel: str
    func: ast.FunctionDef
    cls: ClassRef | None


#: The needs of a literal `False`: the test that led to it says more.
_NOTHING = ("nothing",)


class Gates:
    """Evaluates vLLM's predicates for one `Machine`, following calls through `src`'s files."""

    def __init__(self, src: VllmSource, machine: Machine) -> None:
        self.src = src
        self.machine = machine

    # ---- where names live --------------------------------------------------------------------

    def resolve(self, rel: str, name: str) -> tuple[str, ast.AST] | None:
        """The definition (class or function) `name` means in `rel`: its own top level, else what it is
        imported as (`code.import_origin`), one file on."""
        found = self._top_level(rel, name)
        if found is not None:
            return found
        origin = import_origin(self.src, rel, name)
        return self._top_level(*origin) if origin is not None else None

    def module_alias(self, rel: str, name: str) -> str | None:
        """The file an `import vllm.x.y as name` (or `from vllm.x import y as name`, y a module) in
        `rel` names."""
        parsed = self.src.parsed(rel)
        if parsed is None:
            return None
        for node in ast.walk(parsed[0]):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname == name:
                        return self.src.module_file(a.name)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if (a.asname or a.name) == name:
                        found = self.src.module_file(f"{node.module}.{a.name}")
                        if found is not None:
                            return found
        return None

    def _top_level(self, rel: str, name: str) -> tuple[str, ast.AST] | None:
        parsed = self.src.parsed(rel)
        if parsed is None:
            return None
        node = next(
            (n for n in parsed[0].body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name), None
        )
        return (rel, node) if node is not None else None

    def predicate(self, rel: str, cls: str, name: str) -> tuple[Truth, str, ast.FunctionDef] | None:
        """`cls.name()` (a class of `rel` or one it imports) evaluated, with where the method is; None
        where the class or the method is not found."""
        found = self.resolve(rel, cls)
        method = self.method(rel, cls, name)
        if found is None or method is None:
            return None
        return self.function(method[0], method[1], 0, ClassRef(found[0], cls)), method[0], method[1]

    def method(self, rel: str, cls: str, name: str, depth: int = 0) -> tuple[str, ast.FunctionDef] | None:
        """`cls.name` as Python finds it: the class's own, else its bases' (named or `module.Class`)."""
        found = self.resolve(rel, cls)
        if found is None or not isinstance(found[1], ast.ClassDef) or depth > MAX_DEPTH:
            return None
        where, node = found[0], found[1]
        assert isinstance(node, ast.ClassDef)
        own = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if own is not None:
            return where, own
        for base in node.bases:
            if isinstance(base, ast.Name):
                hit = self.method(where, base.id, name, depth + 1)
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                origin = self.module_alias(where, base.value.id)
                hit = self.method(origin, base.attr, name, depth + 1) if origin else None
            else:
                hit = None
            if hit is not None:
                return hit
        return None

    # ---- evaluation -------------------------------------------------------------------------------

    def function(
        self, rel: str, func: ast.FunctionDef, depth: int = 0, cls: ClassRef | None = None, wrapped: bool = True
    ) -> Truth:
        """What `func` returns, read as a predicate: its statements run on this machine (`cls` bound to
        the class it was looked up on), through its decorators' wrappers when `wrapped`."""
        if depth > MAX_DEPTH:
            return Truth(None, unread=f"{func.name} calls too deep to follow")
        decorators = [d for d in func.decorator_list if _dotted(_called(d)) not in _TRANSPARENT] if wrapped else []
        if decorators:
            return self._decorated(rel, func, decorators[-1], depth, cls)
        env: dict[str, object] = {"cls": cls} if cls is not None else {}
        return self._block(rel, func.body, env, depth)

    def _decorated(
        self, rel: str, func: ast.FunctionDef, decorator: ast.expr, depth: int, cls: ClassRef | None
    ) -> Truth:
        """A decorator read as its wrapper: the wrapper's body, where calling the decorator's parameter
        runs `func` itself (one decorator: vLLM's gates carry at most one)."""
        found = self.resolve(rel, decorator.id) if isinstance(decorator, ast.Name) else None
        outer = found[1] if found is not None and isinstance(found[1], ast.FunctionDef) else None
        inner = next((n for n in outer.body if isinstance(n, ast.FunctionDef)), None) if outer else None
        if found is None or outer is None or inner is None or not outer.args.args:
            return Truth(None, unread=f"the decorator `{_text(decorator)}` of {func.name} ({rel}:{func.lineno})")
        env: dict[str, object] = {outer.args.args[0].arg: Wrapped(rel, func, cls)}
        return self._block(found[0], inner.body, env, depth + 1)

    def _block(self, rel: str, body: list[ast.stmt], env: dict[str, object], depth: int) -> Truth:
        skipped: tuple[str, ...] = ()  # what the last `if` passed over would have needed
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, ast.Import | ast.ImportFrom | ast.Pass):
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                env = {**env, stmt.targets[0].id: stmt.value}
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple):
                classes = self._classes(rel, stmt.value, env, depth)
                names = stmt.targets[0].elts
                if classes is None or len(classes) != len(names) or not all(isinstance(n, ast.Name) for n in names):
                    return Truth(None, unread=f"`{_text(stmt)}` ({rel}:{stmt.lineno})")
                env = {**env, **{n.id: c for n, c in zip(names, classes, strict=True) if isinstance(n, ast.Name)}}
                continue
            if isinstance(stmt, ast.Return):
                value = self.expr(rel, stmt.value, env, depth) if stmt.value else Truth(False, _NOTHING)
                return Truth(False, skipped) if value.value is False and value.needs == _NOTHING and skipped else value
            if isinstance(stmt, ast.If):
                test = self.expr(rel, stmt.test, env, depth)
                if test.value is None:
                    return test
                branch = stmt.body if test.value else stmt.orelse
                outcome = self._block(rel, branch, env, depth) if _returns(branch) else None
                if outcome is not None:
                    if outcome.value is False and outcome.needs == _NOTHING:  # `if <test>: return False`
                        return Truth(False, self._unless(rel, stmt.test, test, env, depth))
                    return outcome
                if branch:  # a branch that falls through: only plain statements are followed
                    return Truth(None, unread=f"a branch at line {stmt.lineno} of {rel} that does not return")
                skipped = test.needs
                continue
            return Truth(None, unread=f"a {type(stmt).__name__} statement at line {stmt.lineno} of {rel}")
        return Truth(False, skipped or _NOTHING)

    def _unless(self, rel: str, node: ast.expr, test: Truth, env: dict[str, object], depth: int) -> tuple[str, ...]:
        """What a `False` guarded by `node` (which came out `test`) needs: the guard to come out the other way."""
        if not test.value:
            return test.needs
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.expr(rel, node.operand, env, depth)
            if inner.value is False:
                return inner.needs
        return (f"not `{_text(node)}`",)

    def _classes(self, rel: str, node: ast.expr, env: dict[str, object], depth: int) -> list[ClassRef] | None:
        """The classes a call such as `cls.get_clses()` returns as a tuple of names, or None."""
        target = self._target(rel, node, env) if isinstance(node, ast.Call) else None
        if target is None or depth > MAX_DEPTH:
            return None
        where, func, _ = target
        returned = next((n for n in ast.walk(func) if isinstance(n, ast.Return)), None)
        if returned is None or not isinstance(returned.value, ast.Tuple):
            return None
        found = []
        for elt in returned.value.elts:
            hit = self.resolve(where, elt.id) if isinstance(elt, ast.Name) else None
            if hit is None or not isinstance(hit[1], ast.ClassDef):
                return None
            found.append(ClassRef(hit[0], hit[1].name))
        return found

    def expr(self, rel: str, node: ast.expr, env: dict[str, object], depth: int) -> Truth:
        """`node` read as a condition on this machine."""
        found = self._expr(rel, node, env, depth)
        if found.value is False and found.at is None:
            return replace(found, at=(rel, node.lineno))
        return found

    def _expr(self, rel: str, node: ast.expr, env: dict[str, object], depth: int) -> Truth:
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool)):
            return Truth(bool(node.value), () if node.value else _NOTHING)
        if isinstance(node, ast.BoolOp):
            parts = [self.expr(rel, v, env, depth) for v in node.values]
            if isinstance(node.op, ast.And):
                false = [p for p in parts if p.value is False]
                if false:
                    return false[0]
                unread = next((p for p in parts if p.value is None), None)
                return unread if unread is not None else Truth(True)
            if any(p.value for p in parts):
                return Truth(True)
            unread = next((p for p in parts if p.value is None), None)
            if unread is not None:
                return unread
            return Truth(False, tuple(w for p in parts for w in p.needs), at=parts[0].at)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.expr(rel, node.operand, env, depth)
            if inner.value is None:
                return inner
            return Truth(not inner.value, () if not inner.value else (f"not {_text(node.operand)}",))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return self._compare(rel, node, env)
        if isinstance(node, ast.Call):
            return self._call(rel, node, env, depth)
        bound = _bound(node, env)
        if bound is not None:
            return self.expr(rel, bound, env, depth)
        return Truth(None, unread=f"`{_text(node)}` ({rel}:{getattr(node, 'lineno', '?')})")

    def _compare(self, rel: str, node: ast.Compare, env: dict[str, object]) -> Truth:
        left = self._value(node.left, env)
        right = self._value(node.comparators[0], env)
        op = node.ops[0]
        if left is _UNKNOWN or right is _UNKNOWN:
            return Truth(None, unread=f"`{_text(node)}` ({rel}:{node.lineno})")
        if isinstance(op, ast.Eq | ast.Is):
            value = left == right
        elif isinstance(op, ast.NotEq | ast.IsNot):
            value = left != right
        else:
            return Truth(None, unread=f"`{_text(node)}` ({rel}:{node.lineno})")
        return Truth(value, () if value else (_text(node),))

    def _value(self, node: ast.expr, env: dict[str, object]) -> object:
        """A plain value a gate compares: constants, `sys.platform`, the CPU architecture, the device capability."""
        bound = _bound(node, env)
        if bound is not None:
            return self._value(bound, env)
        if isinstance(node, ast.Constant):
            return node.value
        if _dotted(node) == "sys.platform":
            return sys.platform
        if isinstance(node, ast.Attribute) and _dotted(node.value) == "CpuArchEnum":
            return node.attr
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and self._is_platform(node.func.value, env)
        ):
            if node.func.attr == "get_cpu_architecture" and self.machine.platform == "cpu":
                return self.machine.cpu_arch or _UNKNOWN
            if node.func.attr == "get_device_capability" and self.machine.platform == "cpu":
                return None
        return _UNKNOWN

    def _is_platform(self, node: ast.expr, env: dict[str, object]) -> bool:
        bound = _bound(node, env)
        if bound is not None:
            return self._is_platform(bound, env)
        return _dotted(node) == "current_platform"

    def _call(self, rel: str, node: ast.Call, env: dict[str, object], depth: int) -> Truth:
        func = node.func
        machine = self.machine
        if isinstance(func, ast.Attribute) and self._is_platform(func.value, env):
            if func.attr in _PLATFORM_IS:
                value = machine.platform in _PLATFORM_IS[func.attr]
                words = " or ".join(_WORDS.get(p, p) for p in _PLATFORM_IS[func.attr])
                return Truth(value, () if value else (words,))
            if func.attr in _CAPABILITY and machine.platform == "cpu":
                return Truth(False, ("a GPU of a given compute capability",))
        name = _dotted(func)
        if name in _CPU_FLAGS:
            flag, words = _CPU_FLAGS[name]
            if machine.flags is None:
                return Truth(None, unread=f"whether this CPU has {words} (its flags could not be read)")
            value = flag in machine.flags
            return Truth(value, () if value else (f"{words} ({name}())",))
        if name in ("has_zentorch_op", "is_zentorch_moe_supported"):
            return Truth(machine.zentorch, () if machine.zentorch else ("a zentorch package installed beside vLLM",))
        return self._follow(rel, node, env, depth)

    def _follow(self, rel: str, node: ast.Call, env: dict[str, object], depth: int) -> Truth:
        """A call to a function or method defined in vLLM's source: its body, evaluated."""
        if isinstance(node.func, ast.Name) and isinstance(env.get(node.func.id), Wrapped):
            inner = env[node.func.id]
            assert isinstance(inner, Wrapped)
            return self.function(inner.rel, inner.func, depth + 1, inner.cls, wrapped=False)
        target = self._target(rel, node, env)
        if target is None:
            return Truth(None, unread=f"`{_text(node)}` ({rel}:{node.lineno})")
        value = self.function(target[0], target[1], depth + 1, target[2])
        return Truth(False, (f"`{_text(node)}`",)) if value.value is False and value.needs == _NOTHING else value

    def _target(
        self, rel: str, node: ast.Call, env: dict[str, object]
    ) -> tuple[str, ast.FunctionDef, ClassRef | None] | None:
        """(file, function, the class it is called on) for a call: a function by name, `Class.method`,
        `cls.method` or a name bound to a class, `module.function`, `current_platform.method`."""
        func = node.func
        if isinstance(func, ast.Name):
            found = self.resolve(rel, func.id)
            if found is not None and isinstance(found[1], ast.FunctionDef):
                return found[0], found[1], None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        ref: ClassRef | None = None
        if self._is_platform(func.value, env):
            if self.machine.platform not in _PLATFORM_CLASS:
                return None
            ref = ClassRef(*_PLATFORM_CLASS[self.machine.platform])
        elif isinstance(func.value, ast.Name) and isinstance(env.get(func.value.id), ClassRef):
            bound = env[func.value.id]
            assert isinstance(bound, ClassRef)
            ref = bound
        elif isinstance(func.value, ast.Name):
            found = self.resolve(rel, func.value.id)
            if found is not None and isinstance(found[1], ast.ClassDef):
                ref = ClassRef(found[0], found[1].name)
            else:
                origin = self.module_alias(rel, func.value.id)
                hit = self._top_level(origin, func.attr) if origin else None
                if hit is not None and isinstance(hit[1], ast.FunctionDef):
                    return hit[0], hit[1], None
                return None
        if ref is None:
            return None
        method = self.method(ref.rel, ref.name, func.attr)
        return (method[0], method[1], ref) if method is not None else None


def _bound(node: ast.expr, env: dict[str, object]) -> ast.expr | None:
    """The expression a local name was assigned (`p = current_platform`), or None."""
    bound = env.get(node.id) if isinstance(node, ast.Name) else None
    return bound if isinstance(bound, ast.expr) else None


def _returns(body: list[ast.stmt]) -> bool:
    """Whether a branch ends by returning (the only branches `_block` follows into)."""
    return bool(body) and isinstance(body[-1], ast.Return | ast.If) and _ends(body[-1])


def _ends(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Return):
        return True
    if isinstance(stmt, ast.If):
        return _returns(stmt.body) and _returns(stmt.orelse)
    return False


def _called(node: ast.expr) -> ast.expr:
    """A decorator's name node: `lru_cache` for `@lru_cache(maxsize=1)`."""
    return node.func if isinstance(node, ast.Call) else node


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 120 else text[:117] + "..."
