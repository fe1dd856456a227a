"""Parts of a meta-device model made real from a checkpoint, and freed again.

Checkpoint names are mapped to the model's parameter names by transformers' own conversion
mapping (`get_model_conversion_mapping`: renames, MoE experts merged into 3-D parameters, ...),
and a part is loaded by transformers' own `convert_and_load_state_dict_in_model` given only that
part's tensors. So whatever the loader does to a whole checkpoint, it does here to one layer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from weightsmith.core.errors import CheckpointError
from weightsmith.engine.experts import ExpertTable, expert_table
from weightsmith.engine.skeleton import Skeleton
from weightsmith.engine.source import TensorSource
from weightsmith.io.checkpoint import Checkpoint

#: The unit of parameters outside every decoder layer (embeddings, final norm, head).
TOP = -1


class Loader:
    """Which checkpoint tensors make which part of the model, and loading them into it."""

    def __init__(self, skeleton: Skeleton, source: TensorSource) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        self.skeleton = skeleton
        self.source = source
        model = skeleton.model
        # annotated as the base class; its two subclasses, which LoadStateDictConfig wants, are all there are
        self.mapping: list[Any] = get_model_conversion_mapping(model)
        renamings = [t for t in self.mapping if isinstance(t, WeightRenaming)]
        converters = [t for t in self.mapping if isinstance(t, WeightConverter)]
        expected = model.state_dict()
        self.tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
        non_persistent = {name for name, _ in model.named_non_persistent_buffers()}
        layer = re.compile(re.escape(skeleton.layers_path) + r"\.(\d+)\.")
        self.units: dict[int, list[str]] = {}
        self.target_of: dict[str, str] = {}
        #: parameter -> the checkpoint tensors a converter merges into it (MoE experts), in the order of
        #: the converter's source patterns (gate before up: the order their rows are concatenated in)
        self.merged: dict[str, list[str]] = {}
        targets: dict[str, str] = {}
        rank: dict[str, int] = {}  # a merged source -> the index of the source pattern it matched
        for name in source.names:
            target, pattern = rename_source_key(name, renamings, converters, model.base_model_prefix, expected)
            if target not in expected:
                continue  # a tensor the model has no place for (transformers ignores it too)
            if pattern is None and name in source.ckpt.tensors and name not in source.quantized:
                _check_shape(source, name, tuple(expected[target].shape), skeleton.architecture)
            if pattern is not None:
                self.merged.setdefault(target, []).append(name)
                order = (c.source_patterns.index(pattern) for c in converters if pattern in c.source_patterns)
                rank[name] = next(order, 0)
            self.target_of[name] = target
            match = layer.match(target)
            self.units.setdefault(int(match.group(1)) if match else TOP, []).append(name)
            targets.setdefault(target, name)
        for sources in self.merged.values():
            sources.sort(key=rank.__getitem__)  # stable: the checkpoint's order within one pattern
        missing = [k for k in expected if k not in targets and k not in self.tied and k not in non_persistent]
        if missing:
            raise CheckpointError(
                f"is missing: the engine cannot build {skeleton.architecture} without it"
                + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else ""),
                file=source.ckpt.root,
                tensor=missing[0],
                code="engine.missing-tensor",
            )

    def checkpoint_module(self, path: str) -> str:
        """The checkpoint's name of the module at `path` in the model (transformers renames some:
        Laguna's `shared_experts` is the checkpoint's and vLLM's `shared_expert`); `path` itself for a
        module whose tensors are loaded under their own names, merged, or not at all."""
        return self._module_names.get(path, path)

    def linears(self, unit: int) -> dict[str, Any]:
        """Every `torch.nn.Linear` of decoder layer `unit`, under its checkpoint name."""
        import torch

        prefix = self.skeleton.layer_path(unit)
        return {
            self.checkpoint_module(f"{prefix}.{name}"): module
            for name, module in self.skeleton.layers[unit].named_modules()
            if isinstance(module, torch.nn.Linear)
        }

    @cached_property
    def experts(self) -> ExpertTable:
        """The checkpoint modules of each MoE expert slice of the merged parameters (`experts.expert_table`)."""
        return expert_table(self.merged)

    @cached_property
    def _module_names(self) -> dict[str, str]:
        """Model module path -> checkpoint module name, for every module above a tensor loaded as it is
        (not merged): the two names less the trailing components they share."""
        merged = {name for sources in self.merged.values() for name in sources}
        out: dict[str, str] = {}
        for source, target in self.target_of.items():
            if source in merged:
                continue
            t, s = target.split("."), source.split(".")
            k = 1
            while k < min(len(t), len(s)) and t[-k] == s[-k]:
                out.setdefault(".".join(t[:-k]), ".".join(s[:-k]))
                k += 1
        return out

    def load(self, unit: int, *, head: bool = True) -> None:
        """Make the unit's parameters real (float32, CPU), through transformers' loader.

        `head=False` leaves an untied output head on the meta device: running the layers needs only
        the embeddings, and a large vocabulary's head in float32 would double the top level.
        """
        import torch
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig
        from transformers.utils import logging

        model = self.skeleton.model
        names = self.units.get(unit, [])
        if not head:
            prefix = self._head_path() + "."
            names = [n for n in names if not self.target_of[n].startswith(prefix)]
        state = {name: self.source.tensor(name) for name in names}
        config = LoadStateDictConfig(dtype=torch.float32, device_map={"": "cpu"}, weight_mapping=self.mapping)
        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # one bar per layer would fill the terminal
        try:
            info, _ = convert_and_load_state_dict_in_model(model, state, config)
        finally:
            if shown:
                logging.enable_progress_bar()
        del state
        if info.mismatched_keys:
            name, found, wanted = sorted(info.mismatched_keys)[0]
            raise CheckpointError(
                f"has shape {list(found)} but {self.skeleton.architecture} needs {list(wanted)}",
                file=self.source.ckpt.root,
                tensor=name,
                code="engine.shape",
            )
        if info.conversion_errors:
            name, why = next(iter(info.conversion_errors.items()))
            raise CheckpointError(
                f"cannot be converted by transformers ({str(why).strip().splitlines()[0][:200]})",
                file=self.source.ckpt.root,
                tensor=name,
                code="engine.convert",
            )
        if unit == TOP and self.tied:
            model.tie_weights()

    def _head_path(self) -> str:
        head = self.skeleton.model.get_output_embeddings()
        path: str = next(path for path, module in self.skeleton.model.named_modules() if module is head)
        return path

    def free(self, unit: int) -> None:
        """Send the unit's parameters back to the meta device (buffers stay: they are not weights)."""
        import torch

        inside = self.skeleton.layers_path + "."
        if unit == TOP:
            modules = [m for path, m in self.skeleton.model.named_modules() if not path.startswith(inside)]
        else:
            modules = list(self.skeleton.layers[unit].modules())
        for module in modules:
            for name, param in list(module._parameters.items()):
                if param is not None and param.device.type != "meta":
                    module._parameters[name] = torch.nn.Parameter(
                        torch.empty_like(param, device="meta"), requires_grad=False
                    )


def _check_shape(source: TensorSource, name: str, wanted: tuple[int, ...], architecture: str) -> None:
    """A tensor loaded as it is must have its parameter's shape: found now, not hours into a run."""
    found = tuple(source.ckpt.tensors[name].info.shape)
    if found != wanted:
        raise CheckpointError(
            f"has shape {list(found)} but {architecture} needs {list(wanted)}",
            file=source.ckpt.file_of(name),
            tensor=name,
            code="engine.shape",
        )


@contextmanager
def opened(ckpt_dir: Path, *, trust_remote_code: bool = False) -> Iterator[Loader]:
    """The checkpoint's model on the meta device with its loader: everything checked, nothing read."""
    from weightsmith.engine.skeleton import build

    ckpt = Checkpoint.open(ckpt_dir)
    with TensorSource(ckpt) as source:
        yield Loader(build(Path(ckpt_dir), trust_remote_code=trust_remote_code), source)
