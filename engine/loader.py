"""Read a checkpoint's tensors by name from its safetensors shards.

Layers take what they need by name through one :class:`LoadContext` (the checkpoint, the
engine's dtype and device, the FP8 scale format, and the name scope of the layer being built),
each tensor checked against the shape the config implies (:func:`engine.checkpoint.tensor_shapes`);
at the end :meth:`CheckpointWeights.check_all_used` fails on tensors nobody took, so that a
naming mismatch cannot silently leave weights out. Tensors of layers at index >=
num_hidden_layers (DeepSeek-V3's multi-token-prediction layer) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError

from .checkpoint import LoadError, ignored, open_shards, shape_problem, tensor_shapes


class CheckpointWeights:
    def __init__(self, model_dir: str | Path, config):
        self.model_dir = Path(model_dir)
        self.num_layers = config.num_hidden_layers
        self._shapes = tensor_shapes(config)
        self._handles = open_shards(model_dir)
        self._where: dict[str, Path] = {}
        for f, handle in self._handles.items():
            for name in handle.keys():
                if name in self._where:
                    raise LoadError(f"tensor {name!r} is in both {self._where[name].name} and {f.name}")
                self._where[name] = f
        self._taken: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as stored (CPU, checkpoint dtype), of the shape the config implies."""
        if name not in self._where:
            raise LoadError(f"{self.model_dir}: the checkpoint has no tensor {name!r}")
        self._taken.add(name)
        try:
            tensor = self._handles[self._where[name]].get_tensor(name)
        except SafetensorError as exc:
            raise LoadError(f"{self._where[name]}: tensor {name!r} cannot be read ({exc})") from None
        problem = shape_problem(self._where[name], name, tuple(tensor.shape), self._shapes)
        if problem:
            raise LoadError(problem)
        return tensor

    def skip(self, prefix: str) -> None:
        """Leave every tensor named ``prefix...`` unloaded on purpose (another rank's experts);
        :meth:`check_all_used` accepts them."""
        self._taken.update(name for name in self._where if name.startswith(prefix))

    def check_all_used(self) -> None:
        left = [name for name in self._where if name not in self._taken and not ignored(name, self.num_layers)]
        if left:
            shown = ", ".join(sorted(left)[:8])
            raise LoadError(f"{self.model_dir}: {len(left)} tensor(s) the engine does not use: {shown}{' ...' if len(left) > 8 else ''}")


@dataclass(frozen=True)
class LoadContext:
    """What a layer builds its weights from: the checkpoint, the engine's ``dtype`` and
    ``device``, the FP8 ``scale_fmt``, and ``prefix``, the checkpoint name of the layer being
    built (``model.layers.3.self_attn``). Names given to the methods are relative to ``prefix``."""

    weights: CheckpointWeights
    dtype: torch.dtype
    device: torch.device
    scale_fmt: str | None = None
    prefix: str = ""

    def scope(self, name: str) -> LoadContext:
        """The context of the sub-layer ``name`` (its tensors are named ``prefix.name.*``)."""
        return replace(self, prefix=self.name(name))

    def name(self, name: str) -> str:
        """The checkpoint name of ``name`` in this scope."""
        return f"{self.prefix}.{name}" if self.prefix else name

    def has(self, name: str) -> bool:
        return self.weights.has(self.name(name))

    def stored(self, name: str) -> torch.Tensor:
        """The tensor as stored (CPU, checkpoint dtype), shape-checked (:meth:`CheckpointWeights.get`)."""
        return self.weights.get(self.name(name))

    def place(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``tensor`` on the engine's device, in ``dtype`` (default: the engine's dtype)."""
        return tensor.to(device=self.device, dtype=dtype if dtype is not None else self.dtype)

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` on the engine's device, in ``dtype`` (default: the engine's dtype)."""
        return self.place(self.stored(name), dtype)

    def skip(self, name: str) -> None:
        """Leave every tensor whose name starts with ``name`` in this scope unloaded on purpose
        (:meth:`CheckpointWeights.skip`)."""
        self.weights.skip(self.name(name))
