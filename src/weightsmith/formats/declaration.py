"""The one reader of a quantized checkpoint's quantization declaration, in one shape for every producer.

`quantize` (is the source already quantized, or FP8?), `verify` (are the tensors stored as declared?),
`preflight` (which kernel will vLLM pick?), `eval` and the engine (which modules are quantized, and
how to dequantize them) all ask what a checkpoint declares; reading it in one place keeps their
answers from drifting apart.

Three producers are understood: compressed-tensors (`config.json` `quantization_config`, matched as
vLLM matches it, `targets.Targets`: exact names, `re:` regexes anchored at the start, and the
class name `Linear`), NVIDIA ModelOpt (`hf_quant_config.json`, or its converted `config.json` form,
with fnmatch wildcards in `exclude_modules`/`ignore`), and the HF/DeepSeek `fp8` block format.
`config.json` wins when both files declare, as in vLLM's `get_quant_config`.

Two ways in. `read_declaration` reads the config alone and never refuses it: a value a loader would
refuse is a `ConfigProblem` (and read as absent), for the caller to report or refuse with.
`quantized_modules` reads a compressed-tensors checkpoint's config against its tensors and raises a
one-line `CheckpointError` for anything it cannot dequantize. A quantized module is one whose
weight is stored quantized (a `weight_packed`, or a `weight_scale`); the tensors say which modules,
the config says how. Its config group is the one vLLM loads it with (`targets.Groups`): the first
target in config order that names it, then the class name `Linear` (every module stored quantized
is Linear-like), then a fused layer's shards. `verify` warns where compressed-tensors, which
quantized it, would have picked another group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from weightsmith.core.errors import CheckpointError
from weightsmith.core.terminal import short_repr
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import compressors, hf_fp8, layouts, modelopt
from weightsmith.formats.layouts import Layout, parse_block
from weightsmith.formats.modelopt import HF_QUANT_CONFIG_FILE, MODELOPT_NVFP4, MODELOPT_NVFP4_REQUIRED_KEYS
from weightsmith.formats.targets import Groups, Targets, number_blind
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE, Checkpoint

MODELOPT, HF_FP8 = "modelopt", hf_fp8.QUANT_METHOD
HF_FP8_BLOCK = "fp8-block"
#: `QuantizationArgs` fields read -> the JSON type each must have, in words.
_ARG_TYPES: dict[str, tuple[type, str]] = {
    "num_bits": (int, "an integer"),
    "type": (str, "a string"),
    "group_size": (int, "an integer"),
    "strategy": (str, "a string"),
    "symmetric": (bool, "true or false"),
    "dynamic": (bool, "true or false"),
    "scale_dtype": (str, "a string"),
}


@dataclass(frozen=True)
class DeclaredActivations:
    """A config group's `input_activations`, as far as vLLM picks its scheme by them (a value of the
    wrong JSON type reads as None: vLLM's own validation refuses the config first)."""

    num_bits: int | None
    type: str | None
    strategy: str | None
    #: true, false, or compressed-tensors' "local" (NVFP4: local scales at run time, a stored global one).
    dynamic: bool | str | None
    symmetric: bool = True

    @classmethod
    def of(cls, block: object) -> DeclaredActivations | None:
        """The `input_activations` object of a group, or None when it has none (weight-only)."""
        if not isinstance(block, dict):
            return None
        bits, kind, strategy, dynamic = (block.get(k) for k in ("num_bits", "type", "strategy", "dynamic"))
        return cls(
            bits if type(bits) is int else None,
            kind if isinstance(kind, str) else None,
            strategy if isinstance(strategy, str) else None,
            dynamic if isinstance(dynamic, bool | str) else None,
            block.get("symmetric") is not False,
        )


@dataclass(frozen=True)
class ConfigProblem:
    """A value of the declaration a loader would refuse (it was read as absent), in one sentence."""

    message: str
    #: The file that holds it (`config.json` or `hf_quant_config.json`).
    file: str


class NamedModule(Protocol):
    """A module as `QuantDeclaration.resolve` asks about it: its name, that name with layer and
    expert numbers folded (`pattern`), and whether it is an `lm_head` (`audit.modules.Module` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def pattern(self) -> str: ...

    @property
    def lm_head(self) -> bool: ...


@dataclass(frozen=True)
class DeclaredGroup:
    """One config group: what it targets and how a targeted module must be stored."""

    name: str
    targets: tuple[str, ...]
    format: str | None
    num_bits: int | None = None
    weight_type: str | None = None
    group_size: int | None = None
    strategy: str | None = None
    symmetric: bool = True
    #: Dtypes a scale stored "in the original dtype" may have (the formats say which).
    scale_dtypes: frozenset[str] = ct.ORIGINAL_FLOATS
    #: The parameter holding the activations' calibrated scale, when they keep one (`layouts.input_scale`).
    input_scale: str | None = None
    block: tuple[int, int] | None = None
    #: The group's `input_activations` (None: weight-only), for what vLLM builds from it (preflight).
    activations: DeclaredActivations | None = None
    #: The `scale_dtype` as declared (`torch.uint8` marks MX scales), None when unset.
    scale_dtype: str | None = None

    @property
    def args(self) -> layouts.Args:
        return layouts.Args(self.num_bits, self.weight_type, self.strategy, self.group_size, self.block, self.symmetric)


@dataclass
class QuantDeclaration:
    """A quantization config, reduced to the questions asked of each module (which group, ignored, layout)."""

    method: str
    source: str
    schemes: tuple[DeclaredGroup, ...] = ()
    ignore: tuple[str, ...] = ()
    #: The declared KV-cache scheme in words, or None; `kv_static` says whether scales must ship.
    kv_cache: str | None = None
    kv_source: str | None = None
    kv_static: bool = True
    #: config.json's `kv_cache_scheme` as read (num_bits, type, dynamic), None when absent or empty: what
    #: the card says of the KV cache it serves with.
    kv_args: DeclaredActivations | None = None
    #: Values a loader refuses, in the order read; each was read as absent. Empty: well-formed.
    problems: list[ConfigProblem] = field(default_factory=list)
    fnmatch_ignore: bool = False
    #: `quant_method` as written (its `repr`), when it names no producer read here: nothing else was read.
    unread_method: str | None = None
    #: Targets that may be class names other than `Linear`, which tensor names cannot reveal; each is
    #: matched as an exact module name only.
    class_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        groups = {s.name: s.targets for s in self.schemes}
        self._groups = Groups(groups, CONFIG_FILE, strict=False)
        self._by_name = {s.name: s for s in self.schemes}
        self._layouts: dict[DeclaredGroup, Layout | None] = {}
        #: (scheme, ignored) by (name pattern, lm_head), when no entry can tell layer or expert numbers apart.
        blind = not self.fnmatch_ignore and number_blind([*self.ignore, *(t for s in self.schemes for t in s.targets)])
        self._by_pattern: dict[tuple[str, bool], tuple[DeclaredGroup | None, bool]] | None = {} if blind else None
        self._ignore = Targets(
            self.ignore, "quantization_config ignore", CONFIG_FILE, wildcards=self.fnmatch_ignore, strict=False
        )
        for pattern in [*self._ignore.broken, *self._groups.broken]:
            self.problems.append(ConfigProblem(f"pattern {pattern!r} is not a valid regular expression", CONFIG_FILE))

    def scheme_for(self, module: str, lm_head: bool | None = None) -> DeclaredGroup | None:
        """The scheme vLLM applies to this Linear-like module: by name first, then by class.

        vLLM's `ParallelLMHead` is not a Linear class, so `lm_head` is targeted only by name.
        `lm_head` may be passed when the caller already knows whether the module is one.
        """
        group = self._groups.group(module, lm_head)
        return None if group is None else self._by_name[group]

    def resolve(self, module: NamedModule) -> tuple[DeclaredGroup | None, bool]:
        """`scheme_for` and `ignored` of a module, asked once per name pattern when the config allows."""
        if self._by_pattern is None:
            return self.scheme_for(module.name, module.lm_head), self.ignored(module.name)
        key = (module.pattern, module.lm_head)
        found = self._by_pattern.get(key)
        if found is None:
            found = self._by_pattern[key] = (self.scheme_for(module.name, module.lm_head), self.ignored(module.name))
        return found

    def claims(self, name: str) -> bool:
        """Whether an `ignore` entry matches `name` itself: how vLLM tests a fused layer when its quant config
        has no `packed_modules_mapping` to test the layer's shards by (a draft's, `preflight/draft.py`)."""
        return self._ignore.matches(name)

    def ignored(self, module: str) -> bool:
        """Listed in `ignore` itself, or its fused layer (`qkv_proj` for `q_proj`) listed exactly, as vLLM reads it.

        A ModelOpt wildcard also covers a shard through its fused layer's name.
        """
        if self.fnmatch_ignore:
            fused = names.fused_partners(module)
            return self._ignore.matches(module, *([fused[0]] if fused else []))
        return self._ignore.ignores(module)

    def precedence_conflicts(self, modules: list[str]) -> list[tuple[str, str, str]]:
        """(module, vLLM's group, compressed-tensors' group) for each module the two resolve differently."""
        if self.method != ct.QUANT_METHOD or len(self.schemes) < 2:
            return []
        return self._groups.conflicts(modules, self._ignore)

    @property
    def undescribed(self) -> list[DeclaredGroup]:
        """The groups whose format no layout here describes: their tensors cannot be checked against it."""
        if self.method == MODELOPT:
            return [s for s in self.schemes if s.format not in modelopt.LAYOUTS]
        if self.method == ct.QUANT_METHOD:
            return [s for s in self.schemes if s.format not in compressors.REGISTRY]
        return []

    def layout(self, scheme: DeclaredGroup) -> Layout | None:
        """The tensors a module stored under `scheme` must have (a `FLOAT_SCALE` dtype: one of
        `scheme.scale_dtypes`), or None for a format no layout describes."""
        if scheme not in self._layouts:  # asked once per module: 100k times on a large MoE
            if self.method == MODELOPT:
                self._layouts[scheme] = modelopt.LAYOUTS.get(scheme.format or "")
            elif self.method == HF_FP8:
                self._layouts[scheme] = hf_fp8.layout(scheme.block)
            else:
                self._layouts[scheme] = compressors.layout_of(scheme.format, scheme.args, scheme.input_scale)
        return self._layouts[scheme]


def read_declaration(config: dict[str, Any] | None, hf_quant_config: dict[str, Any] | None) -> QuantDeclaration | None:
    """The checkpoint's quantization declaration, or None when it declares none."""
    qc = config.get("quantization_config") if config else None
    if isinstance(qc, dict):
        method = qc.get("quant_method")
        if method == ct.QUANT_METHOD:
            decl = _compressed_tensors(qc)
        elif method == MODELOPT:
            decl = _modelopt_config_json(qc)
        elif method == HF_FP8:
            decl = _hf_fp8(qc)
        else:
            return QuantDeclaration(str(method), f"{CONFIG_FILE} quantization_config", unread_method=repr(method))
        kv = qc.get("kv_cache_scheme")
        decl.kv_args = DeclaredActivations.of(kv) if kv else None
        return decl
    if qc is not None:
        return QuantDeclaration(
            "invalid", CONFIG_FILE, problems=[ConfigProblem("quantization_config is not a JSON object", CONFIG_FILE)]
        )
    if isinstance(hf_quant_config, dict):
        return _modelopt_native(hf_quant_config)
    return None


def _typed(args: dict[str, Any], key: str, where: str, problems: list[ConfigProblem]) -> Any:
    """`args[key]` when absent, null or of the JSON type the key needs; otherwise None and a problem."""
    value = args.get(key)
    kind, words = _ARG_TYPES[key]
    if value is None or type(value) is kind:  # exact: true is not an integer
        return value
    problems.append(ConfigProblem(f"{where}.{key} is {short_repr(value)}, not {words}", CONFIG_FILE))
    return None


def _kv_scheme(kv: object, key: str, problems: list[ConfigProblem], vllm_rule: bool) -> tuple[str | None, bool]:
    """What a `kv_cache_scheme` declares, in words (None: nothing), and whether its scales are static.

    Anything but an object or null is malformed, not "none declared": a loader validates it and
    fails. `{}` declares a scheme with nothing set; vLLM (`CompressedTensorsKVCacheMethod`) refuses
    any compressed-tensors scheme that is neither 8-bit nor float, so `vllm_rule` reports that too.
    """
    if kv is None:
        return None, True
    if not isinstance(kv, dict):
        problems.append(ConfigProblem(f"{key} is {short_repr(kv)}, not an object (null declares none)", CONFIG_FILE))
        return None, True
    bits, kind = kv.get("num_bits"), kv.get("type")
    if vllm_rule and kind != "float" and bits != 8:
        problems.append(
            ConfigProblem(
                f"{key} declares num_bits {short_repr(bits)} and type {short_repr(kind)}; vLLM refuses to load any "
                "KV-cache scheme that is neither 8-bit nor float",
                CONFIG_FILE,
            )
        )
    words = f"{bits}-bit {kind}" if bits and kind else "(num_bits and type unset)"
    return words, kv.get("dynamic") is not True


def _compressed_tensors(qc: dict[str, Any]) -> QuantDeclaration:
    """Every group as a `DeclaredGroup`; each value of the wrong JSON type is a problem and read as absent."""
    source = f"{CONFIG_FILE} quantization_config"
    problems: list[ConfigProblem] = []
    groups = qc.get("config_groups")
    if not isinstance(groups, dict):
        problems.append(
            ConfigProblem("quantization_config.config_groups is not an object of named groups", CONFIG_FILE)
        )
        groups = {}
    top_format = qc.get("format")
    if top_format is not None and not isinstance(top_format, str):
        problems.append(
            ConfigProblem(f"quantization_config.format is {short_repr(top_format)}, not a string", CONFIG_FILE)
        )
        top_format = None
    schemes, unresolved = [], []
    for name, group in groups.items():
        where = f"quantization_config.config_groups[{short_repr(name)}]"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            problems.append(ConfigProblem(f"{where} has no list of targets", CONFIG_FILE))
            continue
        if not all(isinstance(t, str) for t in group["targets"]):
            problems.append(ConfigProblem(f"{where}.targets holds a value that is not a string", CONFIG_FILE))
            continue
        targets = tuple(group["targets"])
        if targets and all(t.endswith("Attention") for t in targets):
            continue  # vLLM drops groups that only target attention classes (KV-cache groups)
        unresolved += [t for t in targets if not t.startswith("re:") and "." not in t and t.lower() != "linear"]
        group_format = group.get("format")
        if group_format is not None and not isinstance(group_format, str):
            problems.append(ConfigProblem(f"{where}.format is {short_repr(group_format)}, not a string", CONFIG_FILE))
            group_format = None
        weights = group.get("weights")
        if weights is None:
            continue
        if not isinstance(weights, dict):
            problems.append(ConfigProblem(f"{where}.weights is not an object", CONFIG_FILE))
            continue
        extra = sorted(set(weights) - ct.QUANT_ARGS_FIELDS)
        if extra:
            problems.append(
                ConfigProblem(
                    f"{where}.weights has unknown keys {short_repr(extra)}; "
                    "compressed-tensors (and so vLLM) refuses them",
                    CONFIG_FILE,
                )
            )
        args = {key: _typed(weights, key, f"{where}.weights", problems) for key in _ARG_TYPES}
        block = None
        if weights.get("block_structure") is not None:
            try:
                block = parse_block(weights["block_structure"])
            except ValueError as exc:
                problems.append(ConfigProblem(f"{where}.weights.block_structure {exc}", CONFIG_FILE))
        schemes.append(
            DeclaredGroup(
                str(name),
                targets,
                group_format or top_format,
                num_bits=args["num_bits"],
                weight_type=args["type"],
                group_size=args["group_size"],
                strategy=args["strategy"],
                symmetric=args["symmetric"] is not False,
                scale_dtypes=ct.scale_dtypes(args["scale_dtype"]),
                input_scale=layouts.input_scale(group.get("input_activations")),
                block=block,
                activations=DeclaredActivations.of(group.get("input_activations")),
                scale_dtype=args["scale_dtype"],
            )
        )
    key = "quantization_config.kv_cache_scheme"
    kv = qc.get("kv_cache_scheme")
    kv_words, kv_static = _kv_scheme(kv, key, problems, vllm_rule=True)
    return QuantDeclaration(
        ct.QUANT_METHOD,
        source,
        tuple(schemes),
        _ignore_list(qc, "ignore", problems),
        kv_cache=kv_words,
        kv_source=f"{CONFIG_FILE} {key}" if kv_words else None,
        kv_static=kv_static,
        problems=problems,
        class_targets=tuple(dict.fromkeys(unresolved)),
    )


def _ignore_list(
    doc: dict[str, Any], key: str, problems: list[ConfigProblem], file: str = CONFIG_FILE
) -> tuple[str, ...]:
    """A list of module names or patterns; anything else is a problem (and ignores nothing)."""
    value = doc.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(ConfigProblem(f"quantization_config.{key} is {short_repr(value)}, not a list of strings", file))
        return ()
    return tuple(value)


def _modelopt_config_json(qc: dict[str, Any]) -> QuantDeclaration:
    source = f"{CONFIG_FILE} quantization_config"
    algo = str(qc.get("quant_algo") or "").upper()
    key = "quantization_config.kv_cache_scheme"
    problems: list[ConfigProblem] = []
    kv, _ = _kv_scheme(qc.get("kv_cache_scheme"), key, problems, vllm_rule=False)
    return _modelopt(algo, source, qc.get("ignore"), kv, f"{CONFIG_FILE} {key}" if kv else None, problems)


def _modelopt_native(doc: dict[str, Any]) -> QuantDeclaration:
    source = f"{HF_QUANT_CONFIG_FILE} quantization"
    q = doc.get("quantization")
    if not isinstance(q, dict):
        return QuantDeclaration(
            MODELOPT, source, problems=[ConfigProblem("has no quantization object", HF_QUANT_CONFIG_FILE)]
        )
    algo = str(q.get("quant_algo") or "").upper()
    problems: list[ConfigProblem] = []
    missing = [k for k in MODELOPT_NVFP4_REQUIRED_KEYS if k not in q]
    if algo == MODELOPT_NVFP4 and missing:
        problems.append(
            ConfigProblem(
                f"quantization lacks {missing}; vLLM refuses NVFP4 without them (null is allowed)", HF_QUANT_CONFIG_FILE
            )
        )
    kv = q.get("kv_cache_quant_algo")
    if kv is not None and not isinstance(kv, str):
        problems.append(
            ConfigProblem(
                f"quantization.kv_cache_quant_algo is {short_repr(kv)}, not a string or null", HF_QUANT_CONFIG_FILE
            )
        )
        kv = None
    return _modelopt(
        algo,
        source,
        q.get("exclude_modules"),
        kv or None,
        f"{source}.kv_cache_quant_algo" if kv else None,
        problems,
    )


def _modelopt(
    algo: str, source: str, ignore: object, kv: str | None, kv_source: str | None, problems: list[ConfigProblem]
) -> QuantDeclaration:
    return QuantDeclaration(
        MODELOPT,
        source,
        (DeclaredGroup(algo, ("Linear",), algo),),
        tuple(str(i) for i in ignore) if isinstance(ignore, list) else (),
        kv_cache=kv,
        kv_source=kv_source,
        problems=problems,
        fnmatch_ignore=True,
    )


def _hf_fp8(qc: dict[str, Any]) -> QuantDeclaration:
    problems: list[ConfigProblem] = []
    try:
        block = hf_fp8.block_size(qc)
    except ValueError as exc:
        problems.append(ConfigProblem(str(exc), CONFIG_FILE))
        block = None
    ignore = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
    scheme = DeclaredGroup(
        HF_FP8_BLOCK,
        ("Linear",),
        HF_FP8_BLOCK,
        num_bits=8,
        weight_type="float",
        scale_dtypes=hf_fp8.scale_dtypes(qc),
        block=block,
    )
    # transformers skips a module when any entry is a substring of its name.
    patterns = [f"re:.*{re.escape(str(i))}" for i in ignore] if isinstance(ignore, list) else []
    return QuantDeclaration(HF_FP8, f"{CONFIG_FILE} quantization_config", (scheme,), tuple(patterns), problems=problems)


#: Parameters of a module that belong to its quantized weight (passed to the dequantizer).
WEIGHT_PARAMS = (
    names.WEIGHT,
    names.WEIGHT_PACKED,
    names.WEIGHT_SCALE,
    names.WEIGHT_SHAPE,
    names.WEIGHT_ZERO_POINT,
    names.WEIGHT_GLOBAL_SCALE,
)
#: Any of these on disk marks a module's weight as quantized.
MARKERS = (names.WEIGHT_PACKED, names.WEIGHT_SCALE)


@dataclass(frozen=True)
class QuantizedModule:
    """One quantized module: its config group and the tensors that hold its weight."""

    module: str
    group: str
    format: str | None
    weights: dict[str, Any]
    #: parameter name (`weight_packed`, ...) -> full tensor name in the checkpoint
    params: dict[str, str]

    @property
    def category(self) -> str:
        return names.category(f"{self.module}.{names.WEIGHT}")

    @property
    def marker(self) -> str:
        """The tensor an error about the module's weight names: its packed values, else its scale."""
        return self.params.get(names.WEIGHT_PACKED) or self.params[names.WEIGHT_SCALE]


def _weight_groups(ckpt: Checkpoint) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The quantization config and its config groups that quantize weights, or a one-line error."""
    cfg = ckpt.root / CONFIG_FILE
    qc = ckpt.quantization_config
    if qc is None:
        raise CheckpointError(
            "has no quantization_config: QUANT must be a quantized compressed-tensors checkpoint",
            file=cfg,
            code="eval.not-quantized",
        )
    method = qc.get("quant_method")
    if method != ct.QUANT_METHOD:
        raise CheckpointError(
            f"quant_method is {method!r}: QUANT must be a {ct.QUANT_METHOD} checkpoint",
            file=cfg,
            code="eval.not-compressed-tensors",
        )
    groups = qc.get("config_groups")
    weight_groups = {
        name: g
        for name, g in (groups.items() if isinstance(groups, dict) else ())
        if isinstance(g, dict) and isinstance(g.get("weights"), dict)
    }
    if not weight_groups:
        raise CheckpointError(
            "quantization_config has no config group with weights args: nothing in QUANT is quantized",
            file=cfg,
            code="eval.not-quantized",
        )
    return qc, weight_groups


def _required_params(fmt: str | None, weights: dict[str, Any]) -> list[str]:
    """The weight's tensors in its format's layout (activation scales are not needed to dequantize)."""
    layout = compressors.of_group(fmt, weights)
    return list(layout.dtypes(inputs=False)) if layout is not None else []


def quantized_modules(ckpt: Checkpoint) -> list[QuantizedModule]:
    """Every quantized module of `ckpt`, in the order its tensors appear on disk.

    Raises `CheckpointError` when the checkpoint is not compressed-tensors, quantizes nothing, has
    a quantized module no config group targets, or lacks a parameter its format needs.
    """
    qc, groups = _weight_groups(ckpt)
    targets = {g: [str(t) for t in gr["targets"]] for g, gr in groups.items() if isinstance(gr.get("targets"), list)}
    resolver = Groups(targets, ckpt.root / CONFIG_FILE)  # a bad regex is a line naming it, not a traceback mid-match

    params: dict[str, dict[str, str]] = {}
    for name in ckpt.tensors:
        module, param = names.split(name)
        if param in WEIGHT_PARAMS:
            params.setdefault(module, {})[param] = name

    found: list[QuantizedModule] = []
    for module, held in params.items():
        if not any(m in held for m in MARKERS):
            continue
        marker = held.get(names.WEIGHT_PACKED) or held[names.WEIGHT_SCALE]
        # only Linear-like weights carry these parameters, so the class target covers lm_head too
        # (verify reports a quantized lm_head vLLM would not load quantized)
        group_name = resolver.group(module, lm_head=False)
        if group_name is None:
            raise CheckpointError(
                f"is stored quantized but no config group in {CONFIG_FILE} targets {module}",
                file=ckpt.file_of(marker),
                tensor=marker,
                code="eval.untargeted",
            )
        group = groups[group_name]
        fmt = group.get("format") or qc.get("format")
        for param in _required_params(fmt, group["weights"]):
            if param not in held:
                raise CheckpointError(
                    f"is missing: {fmt} needs it to dequantize {module}",
                    file=ckpt.file_of(marker),
                    tensor=f"{module}.{param}",
                    code="eval.missing-param",
                )
        found.append(QuantizedModule(module, group_name, fmt, group["weights"], held))
    if not found:
        raise CheckpointError(
            "declares quantization but no tensor holds a quantized weight (no *.weight_packed or *.weight_scale)",
            file=ckpt.root,
            code="eval.not-quantized",
        )
    return found
