"""Where a GGUF model keeps each expert: tensor offsets from the file's header.

An expert tensor ``blk.<il>.ffn_{gate,up,down}_exps.weight`` (or a fused ``ffn_gate_up_exps``)
stores its experts back to back, the expert index being the slowest dimension, so expert ``e``
is the contiguous slice ``[e * slice_bytes, (e + 1) * slice_bytes)`` of the tensor's data.
Everything else (attention, norms, router, embeddings, output head) is *dense*.

A model split into shards (llama.cpp's ``<prefix>-00001-of-0000N.gguf``, ``split.count`` in the
first shard's metadata) is read shard by shard: each tensor's offset is relative to the shard
that holds it, and the first shard may hold metadata only. The model is opened, and named,
by its first shard, as llama.cpp does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.gguf_header import GgufHeader, read_header

#: Projection numbers of the io trace's ``proj`` column.
PROJECTIONS = {"gate": 0, "up": 1, "down": 2, "gate_up": 3}
_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
_SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(first: str | os.PathLike[str], count: int) -> list[Path]:
    """The `count` shard files of the split model whose first shard is `first`
    (llama.cpp's naming, ``<prefix>-%05d-of-%05d.gguf``)."""
    p = Path(first)
    m = _SHARD_NAME.match(p.name)
    if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
        raise BmoeError(
            f"{p}: the first shard of a {count}-file split model must be named "
            f"<prefix>-00001-of-{count:05d}.gguf"
        )
    return [p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


@dataclass(frozen=True)
class ExpertTensor:
    """One stacked expert tensor of one layer."""

    name: str
    layer: int
    proj: int
    file_offset: int  # absolute offset of the tensor's data in its shard file
    nbytes: int
    n_expert: int
    shard: int = 0  # index of the file holding it in :attr:`ModelLayout.shards`

    @property
    def slice_bytes(self) -> int:
        return self.nbytes // self.n_expert

    def slice_offset(self, expert: int) -> int:
        return self.file_offset + expert * self.slice_bytes


@dataclass
class ModelLayout:
    """The model's static facts and the file position of every expert slice."""

    path: str  # the file the model is opened by (the first shard of a split model)
    arch: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    file_size: int  # all shards together
    shards: list[str] = field(default_factory=list)  # every file, in split order
    tensors: dict[str, ExpertTensor] = field(default_factory=dict)
    by_layer: dict[int, list[ExpertTensor]] = field(default_factory=dict)
    dense_ranges: list[tuple[int, int, int]] = field(default_factory=list)  # shard, offset, n
    dense_tensors: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # same, by name
    layer_dense_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def moe_layers(self) -> list[int]:
        return sorted(self.by_layer)

    def expert_bytes(self, layer: int) -> int:
        """Bytes one expert of `layer` occupies (all its projections)."""
        return sum(t.slice_bytes for t in self.by_layer.get(layer, ()))

    def expert_sizes(self) -> dict[int, int]:
        """Bytes one expert occupies, per MoE layer (a dense layer has none)."""
        return {layer: self.expert_bytes(layer) for layer in self.moe_layers}

    @property
    def total_expert_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def dense_bytes(self) -> int:
        return sum(n for _s, _o, n in self.dense_ranges)


def _header(path: Path) -> GgufHeader:
    if not path.is_file():
        raise BmoeError(f"{path}: no such model file")
    return read_header(path)


def read_layout(path: str | os.PathLike[str]) -> ModelLayout:
    """Read the tensor tables of the GGUF at `path` (every shard of a split model)."""
    try:
        from gguf import GGML_QUANT_SIZES
    except ImportError as exc:  # pragma: no cover
        raise BmoeError("the embedded engine needs the 'gguf' package") from exc
    p = Path(path)
    header = _header(p)

    def field_value(key: str, default: Any = None) -> Any:
        return header.fields.get(key, default)

    n_split = int(field_value("split.count", 1) or 1)
    if n_split > 1 and int(field_value("split.no", 0) or 0) != 0:
        raise BmoeError(
            f"{p}: shard {int(field_value('split.no', 0)) + 1} of {n_split}: "
            "open a split model by its first shard (-00001-of-)"
        )
    files = shard_paths(p, n_split) if n_split > 1 else [p]
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
        file_size=sum(f.stat().st_size for f in files if f.is_file()),
        shards=[str(f) for f in files],
    )
    for shard, file in enumerate(files):
        shard_header = header if shard == 0 else _header(file)
        for t in shard_header.tensors:
            sizes = GGML_QUANT_SIZES.get(t.type)  # type: ignore[call-overload]
            if sizes is None:
                raise BmoeError(f"{file}: tensor {t.name} has ggml type {t.type}, unknown here")
            block, type_bytes = sizes
            count = 1
            for n in t.shape:
                count *= n
            nbytes = count // block * type_bytes
            _add_tensor(layout, t.name, t.shape, shard_header.data_offset + t.offset, nbytes,
                        shard)  # fmt: skip
    for tensors in layout.by_layer.values():
        tensors.sort(key=lambda et: et.proj)
    return layout


def _add_tensor(
    layout: ModelLayout, name: str, shape: tuple[int, ...], offset: int, nbytes: int, shard: int
) -> None:
    n_expert = layout.n_expert
    m = _EXPERT_TENSOR.match(name)
    if m and n_expert and len(shape) == 3 and int(shape[2]) == n_expert:
        et = ExpertTensor(
            name, int(m.group(1)), PROJECTIONS[m.group(2)], offset, nbytes, n_expert, shard
        )
        layout.tensors[name] = et
        layout.by_layer.setdefault(et.layer, []).append(et)
        return
    layout.dense_ranges.append((shard, offset, nbytes))
    layout.dense_tensors[name] = (shard, offset, nbytes)
    if name.startswith("blk."):
        il = int(name.split(".")[1])
        layout.layer_dense_bytes[il] = layout.layer_dense_bytes.get(il, 0) + nbytes
