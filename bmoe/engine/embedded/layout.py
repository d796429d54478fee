"""Where a GGUF file keeps each expert: tensor offsets from the ``gguf`` package.

An expert tensor ``blk.<il>.ffn_{gate,up,down}_exps.weight`` (or a fused ``ffn_gate_up_exps``)
stores its experts back to back, the expert index being the slowest dimension, so expert ``e``
is the contiguous slice ``[e * slice_bytes, (e + 1) * slice_bytes)`` of the tensor's data.
Everything else (attention, norms, router, embeddings, output head) is *dense*.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bmoe.errors import BmoeError

#: Projection numbers of the io trace's ``proj`` column.
PROJECTIONS = {"gate": 0, "up": 1, "down": 2, "gate_up": 3}
_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")


@dataclass(frozen=True)
class ExpertTensor:
    """One stacked expert tensor of one layer."""

    name: str
    layer: int
    proj: int
    file_offset: int  # absolute offset of the tensor's data in the file
    nbytes: int
    n_expert: int

    @property
    def slice_bytes(self) -> int:
        return self.nbytes // self.n_expert

    def slice_offset(self, expert: int) -> int:
        return self.file_offset + expert * self.slice_bytes


@dataclass
class ModelLayout:
    """The model's static facts and the file position of every expert slice."""

    path: str
    arch: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    file_size: int
    tensors: dict[str, ExpertTensor] = field(default_factory=dict)
    by_layer: dict[int, list[ExpertTensor]] = field(default_factory=dict)
    dense_ranges: list[tuple[int, int]] = field(default_factory=list)  # (offset, nbytes)
    layer_dense_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def moe_layers(self) -> list[int]:
        return sorted(self.by_layer)

    def expert_bytes(self, layer: int) -> int:
        """Bytes one expert of `layer` occupies (all its projections)."""
        return sum(t.slice_bytes for t in self.by_layer.get(layer, ()))

    @property
    def total_expert_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def dense_bytes(self) -> int:
        return sum(n for _o, n in self.dense_ranges)


def read_layout(path: str | os.PathLike[str]) -> ModelLayout:
    """Read the tensor table of the GGUF at `path`."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover
        raise BmoeError("the embedded engine needs the 'gguf' package") from exc
    p = Path(path)
    if not p.is_file():
        raise BmoeError(f"{p}: no such model file")
    try:
        reader = GGUFReader(p)
    except (ValueError, OSError) as exc:
        raise BmoeError(f"{p}: not a readable GGUF file ({exc})") from exc

    def field_value(key: str, default: object = None) -> object:
        f = reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    arch = str(field_value("general.architecture", "unknown"))
    n_layer = int(field_value(f"{arch}.block_count", 0) or 0)
    n_expert = int(field_value(f"{arch}.expert_count", 0) or 0)
    n_used = field_value(f"{arch}.expert_used_count", 0) or 0
    if isinstance(n_used, list):
        n_used = max(n_used) if n_used else 0
    layout = ModelLayout(
        path=str(p),
        arch=arch,
        n_layer=n_layer,
        n_expert=n_expert,
        n_expert_used=int(n_used),
        file_size=p.stat().st_size,
    )
    for t in reader.tensors:
        offset, nbytes = int(t.data_offset), int(t.n_bytes)
        m = _EXPERT_TENSOR.match(t.name)
        if m and n_expert and len(t.shape) == 3 and int(t.shape[2]) == n_expert:
            et = ExpertTensor(
                t.name, int(m.group(1)), PROJECTIONS[m.group(2)], offset, nbytes, n_expert
            )
            layout.tensors[t.name] = et
            layout.by_layer.setdefault(et.layer, []).append(et)
            continue
        layout.dense_ranges.append((offset, nbytes))
        if t.name.startswith("blk."):
            il = int(t.name.split(".")[1])
            layout.layer_dense_bytes[il] = layout.layer_dense_bytes.get(il, 0) + nbytes
    for tensors in layout.by_layer.values():
        tensors.sort(key=lambda et: et.proj)
    return layout
