"""Engine-owned memory for the expert tensors, laid out exactly like the file.

Each stacked expert tensor gets its own anonymous reservation (address space only; a page
costs memory once a read writes it). The tensor's ``data`` pointer is rebound into it at the
position that keeps *file offset ≡ address (mod page)*, so an O_DIRECT read of the aligned
window around any expert slice lands in place. Releasing an expert returns the whole pages
inside its slices to the OS, which is what makes RSS follow the cache budget.

When nothing will ever be released (a budget that holds every expert, ``--load-all``) the
reservations can use transparent huge pages (``BMOE_HUGE_PAGES=1``, see
:func:`bmoe.engine.embedded.engine.use_huge_pages`): the expert matmuls miss the TLB less,
at the price of clearing a whole 2 MiB page at the first read into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bmoe.engine.embedded import ggml, libc
from bmoe.engine.embedded.layout import ExpertTensor, ModelLayout


@dataclass
class Block:
    """One expert tensor's reservation."""

    tensor: ExpertTensor
    node: int  # address of the struct ggml_tensor
    original: int  # its data pointer before rebinding (into llama.cpp's mapping)
    base: int  # reservation start (page aligned)
    size: int
    data: int  # the rebound data pointer

    def slice_address(self, expert: int) -> int:
        return self.data + expert * self.tensor.slice_bytes


class ExpertArena:
    """Reservations for every expert tensor of a model; rebinding and page release."""

    def __init__(self, layout: ModelLayout, huge_pages: bool = False):
        self.layout = layout
        self.huge_pages = huge_pages
        self.blocks: dict[str, Block] = {}
        self.by_layer: dict[int, list[Block]] = {}

    def bind(self, name: str, node: int) -> Block:
        """Reserve memory for tensor `name` (the ggml tensor at `node`) and rebind it."""
        if name in self.blocks:
            return self.blocks[name]
        et = self.layout.tensors[name]
        t = ggml.tensor(node)
        if ggml.nbytes(node) != et.nbytes:
            raise ValueError(f"{name}: ggml holds {ggml.nbytes(node)} bytes, the file {et.nbytes}")
        lead = et.file_offset % libc.PAGE
        size = libc.align_up(lead + et.nbytes, libc.HUGE_PAGE if self.huge_pages else libc.PAGE)
        base = libc.reserve(size, huge=self.huge_pages)
        block = Block(et, node, int(t.data), base, size, base + lead)
        ggml.set_data(node, block.data)
        self.blocks[name] = block
        self.by_layer.setdefault(et.layer, []).append(block)
        self.by_layer[et.layer].sort(key=lambda b: b.tensor.proj)
        return block

    @property
    def complete(self) -> bool:
        """Every expert tensor of the file is bound."""
        return len(self.blocks) == len(self.layout.tensors)

    def release(self, layer: int, expert: int) -> int:
        """Give expert (`layer`, `expert`)'s pages back to the OS; the bytes released."""
        return sum(
            libc.release(b.slice_address(expert), b.tensor.slice_bytes)
            for b in self.by_layer.get(layer, ())
        )

    def resident_bytes(self) -> int:
        """Bytes of the reservations resident in RAM (mincore)."""
        return sum(libc.resident_pages(b.base, b.size)[0] for b in self.blocks.values()) * libc.PAGE

    def restore(self) -> None:
        """Point the tensors back at llama.cpp's mapping (before the arena goes away)."""
        for b in self.blocks.values():
            ggml.set_data(b.node, b.original)

    def close(self) -> None:
        for b in self.blocks.values():
            libc.unmap(b.base, b.size)
        self.blocks.clear()
        self.by_layer.clear()
