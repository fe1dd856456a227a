"""What config.json's architecture implies for a checkpoint's tensors: the one statement of it.

vLLM builds the class `architectures[0]` names and loads each tensor into a parameter of it;
transformers builds the class of `model_type`. For the Llama-block families (Llama, Mistral, Qwen2,
Qwen3: `Family.checked_shapes`, their biases stated by each family's module in `weightsmith.families`)
every parameter follows from a few config sizes, so the tensors can be checked against the config
without a model class. `verify` reports each difference as an error finding (`audit.check_arch`),
`quantize` refuses a norm or bias it contradicts and every weight it would quantize against it
(`quantize.plan`), and the SINQ pre-pass folds only into tensors checked here.

Biases are those vLLM's classes build (`llama.py`, `qwen2.py`, `qwen3.py`): a tensor vLLM has no
parameter for is skipped without a word when its name ends in `.bias` (`if name.endswith(".bias")
and name not in params_dict: continue`), so a bias the config does not declare is never served,
and one it declares but the checkpoint lacks fails the load.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from weightsmith.core.terminal import echo
from weightsmith.families import Family, by_architecture
from weightsmith.families.base import ATTENTION, MLP, NORMS
from weightsmith.io import names

#: A config field the shapes need, and the value it takes when absent (None: required).
FIELDS: dict[str, Callable[[dict[str, int]], int] | None] = {
    "hidden_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "num_key_value_heads": lambda c: c["num_attention_heads"],
    "head_dim": lambda c: c["hidden_size"] // c["num_attention_heads"],
    "intermediate_size": None,
    "vocab_size": None,
}
PROJECTIONS = ATTENTION + MLP
#: A decoder layer's tensor: its layer number, and its name after `model.layers.N.`.
LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
#: The codes of a shape config.json contradicts and of a bias the architecture does not build, as
#: `verify` reports them and `quantize` refuses them.
SHAPE, UNEXPECTED_BIAS = "arch.shape", "arch.unexpected-bias"


#: `architectures[0]` -> its family, for the families whose every shape follows from the config
#: (`Family.checked_shapes`: classes whose checkpoints are named `model.layers.N...` with one dense MLP
#: per layer); anything else is not checked (and says so).
ARCHITECTURES: dict[str, type[Family]] = {arch: f for arch, f in by_architecture().items() if f.checked_shapes}


def first_architecture(config: Mapping[str, Any] | None) -> str | None:
    """`architectures[0]`, the class vLLM builds, or None where config.json names none."""
    archs = (config or {}).get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def contradiction(config: Mapping[str, Any] | None) -> str | None:
    """Why config.json's `model_type` and `architectures[0]` name different models, or None.

    A known class beside another model's `model_type`, or a known `model_type` beside another
    model's causal LM (`...ForCausalLM`): vLLM would build one model and transformers the other. A
    draft or wrapper class (`LlamaForCausalLMEagle3`) beside its base model's `model_type` is none.
    """
    model_type, arch = (config or {}).get("model_type"), first_architecture(config)
    if not isinstance(model_type, str) or arch is None:
        return None
    family = ARCHITECTURES.get(arch)
    known = {t for f in ARCHITECTURES.values() for t in f.model_types}
    if (family is not None and model_type not in family.model_types) or (
        family is None and model_type in known and arch.endswith("ForCausalLM")
    ):
        return (
            f"model_type {echo(model_type)} and architectures[0] {echo(arch)} name different models: vLLM "
            f"builds {echo(arch)} (it reads architectures), transformers the class of model_type "
            f"{echo(model_type)}; correct the one that is wrong"
        )
    return None


def config_sizes(config: Mapping[str, Any]) -> tuple[dict[str, int], str | None]:
    """The sizes `FIELDS` names, or with them the first one that is absent or not a positive integer."""
    values: dict[str, int] = {}
    for key, default in FIELDS.items():
        value = config.get(key)
        if value is None and default is not None:
            value = default(values)
        if type(value) is not int or value <= 0:
            return values, key
        values[key] = value
    return values, None


@dataclass(frozen=True)
class Expected:
    """A tensor's shape as config.json implies it, and the config sizes it follows from, in words
    (`hidden_size 256`)."""

    shape: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Architecture:
    """A config of a known family whose sizes are all there: what each tensor of it should be."""

    name: str
    family: type[Family]
    config: Mapping[str, Any]
    sizes: dict[str, int]

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> Architecture | None:
        """The architecture of `config`, or None where it is not a known family or lacks a size (what
        `config_sizes` refuses is left to the caller, which says so its own way)."""
        name = first_architecture(config)
        family = ARCHITECTURES.get(name or "")
        if config is None or name is None or family is None:
            return None
        sizes, bad = config_sizes(config)
        return None if bad is not None else cls(name, family, config, sizes)

    @cached_property
    def _dims(self) -> dict[str, tuple[int, str]]:
        """Each dimension a shape is made of: its size and the config fields it comes from, in words."""
        c, given = self.sizes, self.config
        d = c["head_dim"]
        head = f"head_dim {d}" if "head_dim" in given else f"head_dim {d} (hidden_size / num_attention_heads)"
        return {
            "h": (c["hidden_size"], f"hidden_size {c['hidden_size']}"),
            "q": (c["num_attention_heads"] * d, f"num_attention_heads {c['num_attention_heads']} x {head}"),
            "kv": (c["num_key_value_heads"] * d, f"num_key_value_heads {c['num_key_value_heads']} x {head}"),
            "i": (c["intermediate_size"], f"intermediate_size {c['intermediate_size']}"),
            "v": (c["vocab_size"], f"vocab_size {c['vocab_size']}"),
            "head_dim": (d, head),
        }

    def _expected(self, *dims: str) -> Expected:
        parts = [self._dims[k] for k in dims]
        return Expected(tuple(n for n, _ in parts), ", ".join(dict.fromkeys(w for _, w in parts)))

    @cached_property
    def _per_layer(self) -> dict[str, Expected]:
        """Within one decoder layer: name after `model.layers.N.` -> what it should be."""
        e = self._expected
        out = {f"{n}.{names.WEIGHT}": e("h") for n in NORMS}
        dims = {"q_proj": ("q", "h"), "k_proj": ("kv", "h"), "v_proj": ("kv", "h"), "o_proj": ("h", "q"),
                "gate_proj": ("i", "h"), "up_proj": ("i", "h"), "down_proj": ("h", "i")}  # fmt: skip
        for module in PROJECTIONS:
            out[f"{module}.{names.WEIGHT}"] = e(*dims[names.leaf(module)])
        for module in self.built_biases:
            out[f"{module}.{names.BIAS}"] = e(dims[names.leaf(module)][0])
        out |= {name: e(size) for name, size in self.family.layer_vectors}
        return out

    @cached_property
    def built_biases(self) -> dict[str, str]:
        """The projections with a bias under this config, each with the key that gives it one."""
        return self.family.biases(self.config)

    @property
    def tied(self) -> bool:
        return self.config.get("tie_word_embeddings") is True

    def outside_layers(self) -> dict[str, Expected]:
        """The embedding, final norm and (unless tied to the embedding) head."""
        out = {"model.embed_tokens.weight": self._expected("v", "h"), "model.norm.weight": self._expected("h")}
        if not self.tied:
            out["lm_head.weight"] = self._expected("v", "h")
        return out

    def tensors(self, layers: Iterable[int]) -> dict[str, Expected]:
        """Every tensor the runtime loads for `layers` (and the embedding, norm and head): name -> expected."""
        out = self.outside_layers()
        for layer in layers:
            out |= {f"model.layers.{layer}.{rest}": want for rest, want in self._per_layer.items()}
        return out

    def expected(self, name: str) -> Expected | None:
        """What tensor `name` should be, in any decoder layer; None for a name this family does not load."""
        found = LAYER.match(name)
        return self._per_layer.get(found.group(2)) if found else self.outside_layers().get(name)

    def unbuilt_bias(self, name: str) -> str | None:
        """Why `name` is a projection's bias this config gives the runtime no parameter for, or None."""
        found = LAYER.match(name)
        module, param = names.split(found.group(2)) if found else ("", "")
        if param != names.BIAS or module not in PROJECTIONS or module in self.built_biases:
            return None
        flags = {"attention_bias": True, "mlp_bias": True} | ({"qkv_bias": True} if "qkv_bias" in self.config else {})
        key = self.family.biases({**self.config, **flags}).get(module)  # the key that would give it one
        why = f"{self.name} never builds one" if key is None else f"config.json does not set {key}"
        return f"is a bias, but {why}: vLLM skips it, so the model it serves is not the one these weights describe"
