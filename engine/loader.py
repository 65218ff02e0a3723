"""Read a checkpoint's tensors by name from its safetensors shards.

Layers take what they need by name (:meth:`CheckpointWeights.get`); at the end
:meth:`CheckpointWeights.check_all_used` fails on tensors nobody took, so that a naming
mismatch cannot silently leave weights out. Tensors of layers at index >= num_hidden_layers
(DeepSeek-V3's multi-token-prediction layer) are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class LoadError(ValueError):
    """The checkpoint's tensors do not fit the model; the message names the file or tensor."""


class CheckpointWeights:
    def __init__(self, model_dir: str | Path, num_layers: int):
        self.model_dir = Path(model_dir)
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise LoadError(f"{self.model_dir}: no *.safetensors files")
        self.num_layers = num_layers
        self._handles = {f: safe_open(str(f), framework="pt") for f in files}
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
        """The tensor ``name`` as stored (CPU, checkpoint dtype)."""
        if name not in self._where:
            raise LoadError(f"{self.model_dir}: the checkpoint has no tensor {name!r}")
        self._taken.add(name)
        return self._handles[self._where[name]].get_tensor(name)

    def skip(self, prefix: str) -> None:
        """Leave every tensor named ``prefix...`` unloaded on purpose (another rank's experts);
        :meth:`check_all_used` accepts them."""
        self._taken.update(name for name in self._where if name.startswith(prefix))

    def check_all_used(self) -> None:
        left = []
        for name in self._where:
            m = _LAYER.match(name)
            if name in self._taken or (m and int(m.group(1)) >= self.num_layers) or name.endswith("rotary_emb.inv_freq"):
                continue
            left.append(name)
        if left:
            shown = ", ".join(sorted(left)[:8])
            raise LoadError(f"{self.model_dir}: {len(left)} tensor(s) the engine does not use: {shown}{' ...' if len(left) > 8 else ''}")
