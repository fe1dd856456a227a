"""What a command needs to know of an architecture family, stated once per family (one module each).

A family is the model transformers builds from `model_type` and vLLM from `architectures[0]`. Every
family the engine runs is one `Family` subclass, registered on import (`register`), as a scheme is:
- the dense layout whose every shape follows from the config (`checked_shapes`, `biases`,
  `layer_vectors`: `formats.architecture`, read by `verify`, `quantize` and the SINQ pre-pass);
- the norms the pre-pass may fold column scales into (`foldable_norms`: norms that multiply by their
  weight and feed the projections that read them);
- the routed experts' layout (`experts`: where the config states their count and sizes, the names of an
  expert's projections; `audit.check_experts`);
- the router (`router`: softmax or sigmoid scores, grouped top-k, a score-correction bias, a gate on
  the shared expert; `verify` checks the router's tensors against it, and it is what vLLM CPU's router
  takes or refuses, docs/moe.md).
The checkpoint names of every family's modules come from transformers' own conversion mapping
(`engine.loading`), so no family restates them. A family not registered is refused, in one line, by
the commands that run the model layer by layer (`require_family`: GPTQ and calibrate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import echo

ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
#: A size the config gives, or derives from other fields (None where the config lacks them).
Size = Callable[[Mapping[str, Any]], Any]


def key(name: str) -> Size:
    """The config value under `name`."""
    return lambda config: config.get(name)


#: A shared expert sized by its own config key (Qwen2-MoE, Laguna): the size, in a finding's words.
SHARED_EXPERT_SIZE: tuple[Size, str] = (key("shared_expert_intermediate_size"), "shared_expert_intermediate_size")


@dataclass(frozen=True)
class Experts:
    """Where a family's config says how many routed experts an MoE layer has, each one's intermediate
    size and the shared expert's (None: the family has none), each with the words a finding uses; and
    what an expert's projections are called on disk."""

    count: str
    size: str
    shared: tuple[Size, str] | None = None
    #: Other keys transformers writes the expert count under (its config's `attribute_map`).
    aliases: tuple[str, ...] = ()
    #: Those that read the hidden state (out = the expert's size), and the one that writes it.
    reads: tuple[str, ...] = ("gate_proj", "up_proj")
    writes: str = "down_proj"

    def count_key(self, config: Mapping[str, Any]) -> str:
        """The key config.json gives the expert count under: `count`, else the first alias present."""
        return next((k for k in (self.count, *self.aliases) if k in config), self.count)


@dataclass(frozen=True)
class Router:
    """How an MoE layer scores and picks its experts, and the tensors that does it with."""

    #: "softmax" or "sigmoid": how router logits become expert scores.
    scoring: str
    #: The config key of the experts each token is routed to.
    top_k: str = "num_experts_per_tok"
    #: Grouped top-k (DeepSeek: `n_group` groups, the best `topk_group` of them searched).
    grouped: bool = False
    #: Where a per-expert bias added to the scores before the top-k may be, under the MoE block
    #: (`gate.e_score_correction_bias`); None where the family has none.
    score_bias: str | None = None
    #: The config value under which vLLM builds that bias (key, value); None: whenever the family has one.
    #: A bias in a checkpoint whose config does not ask for it has no parameter to load into.
    score_bias_when: tuple[str, str] | None = None
    #: A sigmoid gate [1, hidden] on the shared expert's output (`shared_expert_gate`).
    shared_gate: bool = False
    #: The router's module under the MLP (`mlp.gate`; Mixtral's `block_sparse_moe.gate`).
    module: str = "gate"


class Family:
    """One architecture family; subclasses state its facts as class attributes (see the module)."""

    #: The `model_type`s transformers builds it from (a text-only and a multimodal one, say).
    model_types: ClassVar[tuple[str, ...]]
    #: vLLM's classes for it (`architectures[0]` of its checkpoints).
    architectures: ClassVar[tuple[str, ...]]
    #: A dense Llama block whose every tensor's shape follows from the config (`formats.architecture`).
    checked_shapes: ClassVar[bool] = False
    #: Per-layer 1-D tensors beyond the two norms, with the config field that sizes them.
    layer_vectors: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: Norms the pre-pass may fold column scales into: they multiply by their weight ("1 + weight"
    #: norms, Gemma's, may not) and feed exactly the projections after them.
    foldable_norms: ClassVar[tuple[str, ...]] = ()
    experts: ClassVar[Experts | None] = None
    router: ClassVar[Router | None] = None

    @staticmethod
    def biases(config: Mapping[str, Any]) -> dict[str, str]:
        """The projections (`self_attn.q_proj`) vLLM's class gives a bias under `config`, each with the
        config key that gives it one."""
        return {}

    @classmethod
    def name(cls) -> str:
        return cls.model_types[0]


#: `model_type` -> its family, in registration order.
FAMILIES: dict[str, type[Family]] = {}


def register(cls: type[Family]) -> type[Family]:
    for model_type in cls.model_types:
        if model_type in FAMILIES:
            raise ValueError(f"family {model_type!r} registered twice")
        FAMILIES[model_type] = cls
    return cls


def by_architecture() -> dict[str, type[Family]]:
    """vLLM's class (`architectures[0]`) -> its family."""
    return {arch: fam for fam in dict.fromkeys(FAMILIES.values()) for arch in fam.architectures}


def family_of(config: Mapping[str, Any] | None) -> type[Family] | None:
    """The family of a config: by `model_type` (what transformers builds), None when not registered."""
    model_type = (config or {}).get("model_type")
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


def require_family(config: Mapping[str, Any] | None, command: str, file: str | Path | None = None) -> type[Family]:
    """The config's family, or a one-line refusal naming what is missing: `command` runs the model a layer
    at a time and states per family where its experts and router are."""
    family = family_of(config)
    if family is not None:
        return family
    model_type = (config or {}).get("model_type")
    what = f"model_type {echo(model_type)}" if isinstance(model_type, str) else "no model_type"
    raise WeightsmithError(
        f"{what}: {command} knows no such architecture family (known: {', '.join(FAMILIES)}); a family "
        "states its experts and router in one module of weightsmith/families/",
        file=file,
        code="family.unknown",
    )
