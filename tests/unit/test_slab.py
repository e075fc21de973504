"""The shared-memory slab: what goes in comes out, a full slab says so, a lapsed block is never
read as another's, and a killed owner's slab is unlinked by the next process that opens one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from strata.errors import Unavailable
from strata.wire.slab import PAGE, Ref, Slab, SlabLost, Slabs, sweep


def _slab(root: Path, pages: int = 8, lease: float = 30.0) -> Slab:
    return Slab(root, "test", pages * PAGE, 1, lease)


def test_bytes_through_the_slab_equal_the_arrays(tmp_path: Path) -> None:
    slab, slabs = _slab(tmp_path), Slabs(tmp_path)
    crops = np.arange(2 * 3 * 700, dtype=np.uint8).reshape(2, 3, 700)
    floats = np.linspace(0, 1, 1500, dtype=np.float32)[::3]  # not contiguous
    for array in (crops, floats):
        ref = slab.place(array)
        assert ref is not None and ref.key == slab.key
        again = Ref.parse(ref.text())
        assert slabs.read(again, "t") == np.ascontiguousarray(array).tobytes()
    slab.close()
    assert not list(tmp_path.iterdir())


def test_a_full_slab_places_nothing_until_its_blocks_are_released(tmp_path: Path) -> None:
    slab, slabs = _slab(tmp_path, pages=4), Slabs(tmp_path)
    block = np.ones(2 * PAGE, dtype=np.uint8)
    first, second = slab.place(block), slab.place(block)
    assert first is not None and second is not None
    assert slab.place(block) is None  # full: the caller sends bytes
    slabs.read(first, "t")  # released by its reader
    third = slab.place(block)
    assert third is not None and third.offset == first.offset
    assert slab.place(np.ones(5 * PAGE, dtype=np.uint8)) is None  # larger than the slab
    assert slab.place(np.array([b"x" * PAGE], dtype=object)) is None  # BYTES: in the message
    slab.close()


def test_a_block_taken_again_after_its_lease_is_refused(tmp_path: Path) -> None:
    slab, slabs = _slab(tmp_path, pages=2, lease=0.05), Slabs(tmp_path)
    lapsed = slab.place(np.full(2 * PAGE, 7, dtype=np.uint8))
    assert lapsed is not None
    time.sleep(0.1)
    taker = slab.place(np.full(2 * PAGE, 9, dtype=np.uint8))
    assert taker is not None and taker.offset == lapsed.offset
    with pytest.raises(SlabLost, match="lease_seconds"):
        slabs.read(lapsed, "t")
    assert slabs.read(taker, "t") == bytes([9]) * 2 * PAGE
    slab.close()


def test_a_part_of_a_block_reads_its_bytes_at_any_offset_and_only_while_the_block_lasts(
    tmp_path: Path,
) -> None:
    slab, slabs = _slab(tmp_path, pages=3, lease=0.05), Slabs(tmp_path)
    data = np.arange(3 * PAGE, dtype=np.uint32).astype(np.uint8)
    block = slab.place(data)
    assert block is not None
    part = Ref.parse(block.part(PAGE - 5, 2 * PAGE + 3).text())  # across a page's edge
    assert slabs.read(part, "t", release=False) == data[PAGE - 5 : 2 * PAGE + 3].tobytes()
    assert bytes(slab.view(part)) == data[PAGE - 5 : 2 * PAGE + 3].tobytes()
    time.sleep(0.1)
    assert slab.place(np.zeros(3 * PAGE, dtype=np.uint8)) is not None  # its lease ran out
    with pytest.raises(SlabLost):
        slabs.read(part, "t", release=False)
    with pytest.raises(Unavailable, match="lies outside"):
        slabs.read(block.part(0, 4 * PAGE), "t")
    slab.close()


def test_refs_this_process_cannot_read_are_unavailable(tmp_path: Path) -> None:
    slab, elsewhere = _slab(tmp_path), tmp_path / "other"
    elsewhere.mkdir()
    ref = slab.place(np.ones(PAGE, dtype=np.uint8))
    assert ref is not None
    with pytest.raises(Unavailable, match="cannot open shared memory slab"):
        Slabs(elsewhere).read(ref, "t")
    with pytest.raises(Unavailable, match="names no Strata slab"):
        Slabs(tmp_path).read(Ref("../etc/passwd", 0, 1, 1), "t")
    with pytest.raises(Unavailable, match="outside"):
        Slabs(tmp_path).read(Ref(ref.key, 1 << 30, 1, 1), "t")
    slab.close()


OWNER = """
import sys, time
from pathlib import Path
from strata.wire.slab import Slab
slab = Slab(Path(sys.argv[1]), "test", 4096 * 4, 1, 30.0)
print(slab.key, flush=True)
time.sleep(60)
"""


def test_a_killed_owners_slab_is_unlinked_by_the_next_opener(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        key = owner.stdout.readline().strip()
        assert (tmp_path / key).exists()
        assert sweep(tmp_path) == []  # alive: its lock is held
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    assert (tmp_path / key).exists()  # a killed process unlinks nothing
    mine = _slab(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.key]
    mine.close()
