"""The read lanes, C and Python, on a file of known bytes: the slices land where the arena
expects them (O_DIRECT windows and buffered reads), demand and speculative bytes are counted
apart, the io-trace records say what was read, and a read past the end is an error."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.engine.embedded import creader, libc
from bmoe.engine.embedded.reader import ExpertReader, SliceTable

SLICE = 10_000  # not a multiple of the page: slices start anywhere in a page
OFFSET = 12_345  # where expert 0's slice of the first tensor starts in the file
N_EXPERT = 6


def _readers():
    yield "python", lambda path, direct: ExpertReader(path, 3, o_direct=direct)
    lib = creader.load()
    if lib is not None:
        yield "c", lambda path, direct: creader.CExpertReader(lib, path, 3, o_direct=direct)


@pytest.fixture
def model_file(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, OFFSET + 3 * N_EXPERT * SLICE, np.uint8)
    path = tmp_path / "m.bin"
    path.write_bytes(data.tobytes())
    return str(path), data


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
@pytest.mark.parametrize("kind", [name for name, _make in _readers()])
def test_slices_land_in_place_and_are_counted(model_file, kind, direct) -> None:
    path, data = model_file
    make = dict(_readers())[kind]
    reader = make(path, direct)
    # two projection tensors of layer 3 laid out one after the other, as in a GGUF; the arena
    # keeps file offset = address (mod page), as the O_DIRECT window needs
    size = N_EXPERT * SLICE
    tables, arenas = [], []
    for proj in range(2):
        offset = OFFSET + proj * size
        base = libc.reserve(size + 2 * libc.PAGE)
        arenas.append((base, size + 2 * libc.PAGE))
        data_addr = base + offset % libc.PAGE
        tables.append(SliceTable(3, proj, 0, offset, SLICE, data_addr))
    reader.set_slices(tables)
    reader.trace = True
    try:
        reader.submit_experts(3, [1, 4]).wait()
        reader.submit_experts(3, [5], spec=True).wait()
        done = reader.drain()
        for t in tables:
            for e in (1, 4, 5):
                got = np.ctypeslib.as_array(
                    (np.ctypeslib.ctypes.c_uint8 * SLICE).from_address(t.data + e * SLICE)
                )
                start = t.offset + e * SLICE
                assert np.array_equal(got, data[start : start + SLICE]), (t.proj, e)
        assert len(done.records) == 6
        assert {(r.layer, r.expert, r.proj) for r in done.records} == {
            (3, e, p) for e in (1, 4, 5) for p in (0, 1)
        }
        assert done.read_bytes == sum(r.read_bytes for r in done.records)
        assert done.spec_bytes == sum(r.read_bytes for r in done.records if r.spec) > 0
        assert all(r.read_bytes >= r.req_bytes == SLICE for r in done.records)
        if reader.o_direct:  # the aligned window around the slice
            assert all(r.read_bytes % 4096 == 0 for r in done.records)
        assert reader.drain().read_bytes == 0  # drained
    finally:
        reader.close()
        for base, n in arenas:
            libc.unmap(base, n)


@pytest.mark.skipif(creader.load() is None, reason="the C read lanes did not compile")
def test_one_call_load_reads_the_misses_then_releases_the_victims(model_file) -> None:
    path, data = model_file
    reader = creader.CExpertReader(creader.load(), path, 3, o_direct=False)
    size = N_EXPERT * SLICE
    base = libc.reserve(size + 2 * libc.PAGE)
    addr = base + OFFSET % libc.PAGE
    reader.set_slices([SliceTable(3, 0, 0, OFFSET, SLICE, addr)])

    def resident(e: int) -> int:  # resident pages wholly inside expert e's slice
        start, end = libc.align_up(addr + e * SLICE), libc.align_down(addr + (e + 1) * SLICE)
        return libc.resident_pages(start, end - start)[0]

    try:
        assert reader.load(3, [0, 2], []) == 0  # nothing released: no release time
        assert resident(0) > 0 and resident(2) > 0
        assert reader.load(3, [5], [(3, 0), (3, 2)]) > 0  # reads 5, gives 0's and 2's back
        assert resident(0) == resident(2) == 0 < resident(5)
        got = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_uint8 * SLICE).from_address(addr + 5 * SLICE)
        )
        assert np.array_equal(got, data[OFFSET + 5 * SLICE : OFFSET + 6 * SLICE])
        assert reader.drain().read_bytes == 3 * SLICE
    finally:
        reader.close()
        libc.unmap(base, size + 2 * libc.PAGE)


@pytest.mark.skipif(creader.load() is None, reason="the C read lanes did not compile")
def test_one_call_load_says_which_read_failed(model_file) -> None:
    path, _data = model_file
    reader = creader.CExpertReader(creader.load(), path, 2, o_direct=False)
    base = libc.reserve(4 * SLICE)
    try:
        reader.set_slices([SliceTable(0, 0, 0, OFFSET + 3 * N_EXPERT * SLICE, SLICE, base)])
        with pytest.raises(OSError, match=r"expert read of .*m\.bin failed"):
            reader.load(0, [0], [])
    finally:
        reader.close()
        libc.unmap(base, 4 * SLICE)


@pytest.mark.parametrize("kind", [name for name, _make in _readers()])
def test_a_read_past_the_end_of_the_file_fails(model_file, kind) -> None:
    path, _data = model_file
    reader = dict(_readers())[kind](path, False)
    base = libc.reserve(4 * SLICE)
    try:
        reader.set_slices([SliceTable(0, 0, 0, OFFSET + 3 * N_EXPERT * SLICE, SLICE, base)])
        with pytest.raises(OSError):
            reader.submit_experts(0, [0]).wait()
    finally:
        reader.close()
        libc.unmap(base, 4 * SLICE)


def test_the_openmp_wait_is_set_before_llama_cpp_loads_unless_the_user_chose(monkeypatch):
    import sys

    from bmoe.engine.embedded.model import prepare_openmp
    from bmoe.errors import BmoeError

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    env: dict[str, str] = {}
    assert prepare_openmp(False, env) is None and env == {}  # plain llama.cpp is left alone
    assert prepare_openmp(True, env) == "GOMP_SPINCOUNT=3000"  # a short spin, then sleep
    assert env == {"GOMP_SPINCOUNT": "3000"}
    passive = {"BMOE_OMP_WAIT": "passive"}
    assert prepare_openmp(True, passive) == "OMP_WAIT_POLICY=PASSIVE"
    assert passive["OMP_WAIT_POLICY"] == "PASSIVE"
    mine = {"GOMP_SPINCOUNT": "300"}
    assert prepare_openmp(True, mine) is None and mine == {"GOMP_SPINCOUNT": "300"}
    spin = {"BMOE_OMP_WAIT": "1000"}
    assert prepare_openmp(True, spin) == "GOMP_SPINCOUNT=1000"
    assert prepare_openmp(True, {"BMOE_OMP_WAIT": "default"}) is None
    with pytest.raises(BmoeError, match="BMOE_OMP_WAIT"):
        prepare_openmp(True, {"BMOE_OMP_WAIT": "fast"})
    monkeypatch.setitem(sys.modules, "llama_cpp", object())
    late: dict[str, str] = {}
    assert prepare_openmp(True, late) is None and late == {}  # libgomp already read its env


def test_huge_pages_only_when_asked_and_where_nothing_is_released() -> None:
    from bmoe.engine.embedded.engine import use_huge_pages

    assert not use_huge_pages(True, {}) and not use_huge_pages(False, {})
    assert use_huge_pages(True, {"BMOE_HUGE_PAGES": "1"})
    assert not use_huge_pages(False, {"BMOE_HUGE_PAGES": "1"})
