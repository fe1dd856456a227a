"""Modules as the headers reveal them: tensors grouped by their module path.

Without a model class, a module is known only by its parameters. A Linear-like module is one with
a two-dimensional `weight` (dense or FP8, or U8 for ModelOpt NVFP4) or a `weight_packed`; norms
and embeddings are excluded because no quantization config treats them as Linear layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from weightsmith.io import names
from weightsmith.safetensors.header import Header, TensorInfo

DENSE_WEIGHT_DTYPES = frozenset({"BF16", "F16", "F32", "F64"})
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")
_INDEX = re.compile(r"\.\d+(?=\.|$)")


class Located(NamedTuple):
    """A tensor's header entry and the shard (file name relative to the root) that holds it."""

    shard: str
    info: TensorInfo


@dataclass
class Module:
    """One module: its path, its parameters on disk, and its name with numbers folded."""

    name: str
    pattern: str
    layer: int | None
    #: A norm or an embedding: never a Linear layer, whatever its parameters.
    not_linear: bool = False
    lm_head: bool = False
    params: dict[str, Located] = field(default_factory=dict)

    @property
    def linear_like(self) -> bool:
        if self.not_linear:
            return False
        if names.WEIGHT_PACKED in self.params:
            return True
        weight = self.params.get(names.WEIGHT)
        return weight is not None and len(weight.info.shape) == 2

    @property
    def quantized(self) -> bool:
        """Stored in a quantized form: a quantization parameter, or a weight that is not dense float."""
        if not names.QUANTIZED_MARKERS.isdisjoint(self.params):
            return True
        weight = self.params.get(names.WEIGHT)
        return weight is not None and weight.info.dtype.code not in DENSE_WEIGHT_DTYPES


def group_modules(headers: dict[str, Header]) -> dict[str, Module]:
    """Tensors grouped by module path (everything before the last dot), in shard order.

    Where two shards hold the same name the first one's copy is kept, as `Survey.tensors` does.
    """
    modules: dict[str, Module] = {}
    roles: dict[str, tuple[bool, bool]] = {}
    for shard, header in headers.items():
        for name, info in header.tensors.items():
            module, _, param = name.rpartition(".")
            entry = modules.get(module)
            if entry is None:
                pattern = pattern_of(module)
                # Roles depend on the shape of a name, not its numbers: decided once per pattern.
                role = roles.get(pattern)
                if role is None:
                    role = roles[pattern] = (
                        names.is_norm(module) or names.is_embedding(module),
                        names.is_lm_head(module),
                    )
                entry = modules[module] = Module(module, pattern, layer_of(module + "."), *role)
            if param not in entry.params:
                entry.params[param] = Located(shard, info)
    return modules


def layer_of(name: str) -> int | None:
    """The decoder layer a tensor belongs to, from `layers.N.` (or `h.N.`, `blocks.N.`)."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def pattern_of(name: str) -> str:
    """The name with every numeric path component replaced by `*`: layers and experts fold together."""
    return _INDEX.sub(".*", name)
