"""The GGUF header reader: the tensor table and metadata the ``gguf`` package's reader gives, on
every generated family and on odd block sizes and shards; damaged headers refused by name."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bmoe.errors import BmoeError
from bmoe.formats.gguf_header import read_architecture, read_header

gguf = pytest.importorskip("gguf", reason="the engine extra (gguf) makes and reads the models")

from bmoe.engine.synth import synth_model  # noqa: E402


def _reference(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    tensors = {
        t.name: (int(t.data_offset), tuple(int(n) for n in t.shape), int(t.tensor_type))
        for t in reader.tensors
    }
    scalars = {}
    for key, f in reader.fields.items():
        if len(f.types) == 1 and f.types[0] != gguf.GGUFValueType.ARRAY and "." in key:
            if key.startswith("GGUF."):  # the reader's own entries (version, counts)
                continue
            scalars[key] = f.contents()
    return tensors, scalars


@pytest.mark.parametrize(
    ("arch", "kind", "split"),
    [("qwen3moe", "f32", 0), ("qwen3moe", "q5_0", 0), ("gemma4", "q4_0", 0),
     ("gpt-oss", "mxfp4", 0), ("deepseek2", "f16", 0), ("qwen2moe", "q8_0", 12)],
)  # fmt: skip
def test_the_header_is_what_the_gguf_package_reads(tmp_path, arch, kind, split) -> None:
    first = synth_model(tmp_path / "m.gguf", "tiny", arch=arch, type=kind, split_max_tensors=split)
    files = sorted(tmp_path.glob("m*.gguf")) if split else [first]
    assert files[0] == first and (len(files) > 1) == bool(split)
    for path in files:
        tensors, scalars = _reference(path)
        header = read_header(path)
        mine = {t.name: (header.data_offset + t.offset, t.shape, t.type) for t in header.tensors}
        assert mine == tensors
        for key, value in scalars.items():
            assert header.fields[key] == value, key
    assert read_architecture(first) == arch


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_damaged_headers_are_refused_naming_the_file(tmp_path) -> None:
    good = synth_model(tmp_path / "good.gguf", "tiny").read_bytes()
    cases = {
        "short.gguf": (good[:30], "a damaged GGUF header (the header ends early)"),
        "text.gguf": (b"not a model at all", "not a GGUF model (no GGUF magic)"),
        "keys.gguf": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40), "metadata keys"),
        "old.gguf": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1"),
        "string.gguf": (
            b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40),
            "a string of 1099511627776 bytes",
        ),
    }
    for name, (data, says) in cases.items():
        path = _write(tmp_path / name, data)
        for read in (read_header, read_architecture):
            with pytest.raises(BmoeError, match=f"{path}: .*") as info:
                read(path)
            assert says in str(info.value)
    end = read_header(tmp_path / "good.gguf").data_offset
    cut = _write(tmp_path / "cut.gguf", good[: end - 64])  # in the tensor table
    assert read_architecture(cut) == "qwen3moe"  # the first key is all it needs
    with pytest.raises(BmoeError, match="the header ends early"):
        read_header(cut)
    with pytest.raises(BmoeError, match="cannot read the model"):
        read_architecture(tmp_path / "missing.gguf")
