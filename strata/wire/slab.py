"""Tensors between two processes of one host through a shared-memory slab that the message names.

A process that sends big tensors (preprocess's crops, the gateway's model inputs) owns one
slab: a file under /dev/shm (`root`) that it maps, cut into pages. It writes a tensor's bytes
into free pages and sends, in place of the bytes, a `Ref`: the slab's key, the offset and size
of the bytes, and the block's generation. The receiver maps the slab by its key (once) and
copies the bytes out (the one copy it would have made parsing them from a message). The block
is released by the receiver once read, where the sender cannot tell when that is (an answer
of preprocess's), or by the sender once the call that named it has ended (a request). A
receiver may pass a ref on to a third process of the host instead of reading it (the gateway
passes preprocess's crops on to inference): the third reads it without releasing it, and the
receiver releases it once that call has ended. A tensor stacked from several blocks names
them all, in order, joined by `REFS`; a sender that frees a block itself may name a part of
it (`Ref.part`: a flight's photos placed once, each part of the flight naming its own).

The slab is a ring. Blocks are taken in order from the head and given back in order from the
tail: a block leaves when its receiver released it, or when its lease ran out (a receiver that
dropped the message, or died, never releases it). When the ring has no room for a tensor the
sender sends its bytes in the message instead; the slab is never waited for.

Guard: every page has a generation, written before the block's bytes. A receiver checks,
after copying, that every page of its block still has its generation: a block whose lease ran
out and whose pages were taken again is refused (`SlabLost`), never read as if it were its own.

Crash cleanup: the owner holds an exclusive `flock` on its slab for its life, so a slab whose
lock can be taken is a dead process's; every process that opens a slab of its own first
unlinks those (`sweep`), and unlinks its own at exit. A receiver maps by key, and a key
carries the owner's pid and a random part, so a restarted owner's slab is never mistaken for
the slab a receiver mapped before.
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import logging
import mmap
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from strata.errors import Unavailable, shown

log = logging.getLogger(__name__)

ASK = "strata.slab"  # a request's parameter: the caller's `domain`, where it reads slabs
READS = "true"  # a strata.v1 answer's info under ASK: it reads the caller's slab too
REFS = ","  # between the refs of a tensor whose bytes lie in several blocks, in order
# Said by a receiver that cannot open the slab a ref names: its set-up, not a passing fault.
SHARED_MEMORY = "cannot open shared memory slab"
PREFIX = "strata-slab-"
KEY = re.compile(r"strata-slab-[a-z]{1,20}-\d{1,10}-[0-9a-f]{16}")
PAGE = 4096
MAGIC = b"STRSLAB1"
_HEADER = 16  # magic, then the page count (u64)
MAX_MAPPED = 16  # slabs a receiver keeps mapped; the oldest is unmapped past it


@dataclass(frozen=True)
class Ref:
    """Where a tensor's bytes lie: `size` bytes at `offset` of slab `key`, block `generation`."""

    key: str
    offset: int
    size: int
    generation: int

    def text(self) -> str:
        return f"{self.key}:{self.offset}:{self.size}:{self.generation}"

    def part(self, start: int, stop: int) -> Ref:
        """Bytes `start` to `stop` of this ref's, named alike (the sender still frees the
        block by its whole ref: a part is for a sender-freed block's readers)."""
        return Ref(self.key, self.offset + start, stop - start, self.generation)

    def pages(self) -> tuple[int, int]:
        """The first page the bytes lie on, and the page after the last."""
        return self.offset // PAGE, -(-(self.offset + self.size) // PAGE)

    @classmethod
    def parse(cls, text: str) -> Ref:
        """A ref as `text` writes it; ValueError for anything else."""
        key, offset, size, generation = text.split(":")
        return cls(key, int(offset), int(size), int(generation))

    @classmethod
    def named(cls, text: str, what: str) -> Ref:
        """The ref a message names for `what`; one that is no ref is Unavailable (a sender's
        bug, never the client's)."""
        try:
            return cls.parse(text)
        except ValueError:
            raise Unavailable(f"{what}: malformed shared memory ref") from None

    @classmethod
    def all_named(cls, text: str, what: str) -> list[Ref]:
        """The refs a message names for `what`, in order (`REFS` between them)."""
        return [cls.named(part, what) for part in text.split(REFS)]


class SlabConfig(Protocol):
    """server.slab (strata.config.server.SlabSettings), as this module reads it."""

    enabled: bool
    root: Path
    size_mib: int
    min_bytes: int
    lease_seconds: float


class SlabLost(Unavailable):
    """A block's bytes are gone: its lease ran out and its pages were taken again."""


def domain(root: Path) -> str:
    """What two processes must share to read each other's slabs: the host's boot and the
    file system under `root` (containers of one host share the boot, not /dev/shm unless it
    is mounted in both)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = os.uname().nodename
    return f"{boot}/{os.stat(root).st_dev}"


def _layout(pages: int) -> tuple[int, int, int]:
    """Offsets of the generations, the releases and the data, and the file's size."""
    generations = _HEADER
    releases = generations + 8 * pages
    data = -(-(releases + 8 * pages) // PAGE) * PAGE
    return generations, releases, data + pages * PAGE


@dataclass
class _Block:
    start: int  # first page
    pages: int
    generation: int
    expires: float  # monotonic


class _Mapped:
    """A slab's pages, generations and releases as numpy views over one mapping."""

    def __init__(self, fd: int, size: int) -> None:
        self.map = mmap.mmap(fd, size)
        head = np.frombuffer(self.map, dtype=np.uint8, count=_HEADER)
        if head[:8].tobytes() != MAGIC:
            self.map.close()
            raise ValueError("not a Strata slab")
        self.pages = int(np.frombuffer(self.map, dtype="<u8", count=1, offset=8)[0])
        generations, releases, end = _layout(self.pages)
        if end > size:
            self.map.close()
            raise ValueError(f"a slab of {self.pages} pages needs {end} bytes, has {size}")
        self.generations = np.frombuffer(self.map, "<u8", self.pages, generations)
        self.releases = np.frombuffer(self.map, "<u8", self.pages, releases)
        self.data = np.frombuffer(self.map, np.uint8, self.pages * PAGE, end - self.pages * PAGE)


class Slab:
    """The slab this process writes into (see the module docstring); thread-safe."""

    def __init__(
        self, root: Path, role: str, size_bytes: int, min_bytes: int, lease_seconds: float
    ) -> None:
        sweep(root)
        pages = max(1, size_bytes // PAGE)
        self.key = f"{PREFIX}{role}-{os.getpid()}-{secrets.token_hex(8)}"
        self.domain = domain(root)
        self.min_bytes = min_bytes
        self._path = root / self.key
        self._lease = lease_seconds
        self._fd = _create(root, self.key, pages)
        self._mapped = _Mapped(self._fd, _layout(pages)[2])
        self._lock = threading.Lock()
        self._blocks: collections.deque[_Block] = collections.deque()
        self._head = 0
        self._generation = 0

    def offered(self, asked: str) -> Callable[[np.ndarray], Ref | None] | None:
        """`place` for a caller that asked for slabs from `asked` (its `domain`) where that
        is this slab's; None (bytes in the message) for any other caller."""
        return self.place if asked == self.domain else None

    def place(self, array: np.ndarray) -> Ref | None:
        """`array`'s bytes (C order, little-endian) written into the slab; None where it is
        smaller than `min_bytes`, not of fixed width, or finds no room."""
        size = array.nbytes
        if (
            size < max(self.min_bytes, 1)
            or array.dtype.kind in "OSUV"
            or array.dtype.byteorder == ">"
        ):
            return None
        block = self._take(-(-size // PAGE))
        if block is None:
            return None
        offset = block.start * PAGE
        target = self._mapped.data[offset : offset + size].view(array.dtype)
        np.copyto(target.reshape(array.shape), array, casting="no")
        return Ref(self.key, offset, size, block.generation)

    def view(self, ref: Ref) -> memoryview:
        """The bytes a ref of this slab's own names, in place (no copy): for reading what
        this process placed while the block is its."""
        return self._mapped.data[ref.offset : ref.offset + ref.size].data

    def free(self, ref: Ref) -> None:
        """Give back a block this process placed, once no receiver will read it (the call
        that named it has ended); the ring reclaims it in turn."""
        self._mapped.releases[ref.offset // PAGE] = ref.generation

    def _take(self, pages: int) -> _Block | None:
        with self._lock:
            self._reclaim()
            start = self._room(pages)
            if start is None:
                return None
            self._generation += 1
            block = _Block(start, pages, self._generation, time.monotonic() + self._lease)
            # The generations first: a receiver still reading a lapsed block there sees them.
            self._mapped.generations[start : start + pages] = block.generation
            self._blocks.append(block)
            self._head = start + pages
            return block

    def _reclaim(self) -> None:
        """Give back blocks from the tail: released ones, and those whose lease ran out."""
        now, releases = time.monotonic(), self._mapped.releases
        while self._blocks:
            block = self._blocks[0]
            if releases[block.start] != block.generation and now < block.expires:
                break
            self._blocks.popleft()
        if not self._blocks:
            self._head = 0

    def _room(self, pages: int) -> int | None:
        """The first page of `pages` free pages in a row after the head, else None."""
        total = self._mapped.pages
        if not self._blocks:
            return 0 if pages <= total else None
        tail = self._blocks[0].start
        if self._head > tail:  # free: head to the end, then the start to the tail
            if self._head + pages <= total:
                return self._head
            return 0 if pages <= tail else None
        return self._head if self._head + pages <= tail else None

    def close(self) -> None:
        """Unlink the slab (receivers that mapped it keep their mapping until they drop it);
        again, nothing."""
        if self._fd < 0:
            return
        self._path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def open_slab(settings: SlabConfig, role: str) -> Slab | None:
    """This process's slab where `settings` turn slabs on and `root` can hold one; None (and
    a warning: every tensor then goes in its message) where it cannot."""
    if not settings.enabled:
        return None
    try:
        slab = Slab(
            settings.root,
            role,
            settings.size_mib << 20,
            settings.min_bytes,
            settings.lease_seconds,
        )
    except OSError as exc:
        log.warning(
            "no shared memory slab under %s (%s): tensors go in the messages; give it room "
            "(docs/deploy.md#shared-memory-between-layers) or lower server.slab.size_mib",
            settings.root,
            exc.strerror or exc,
        )
        return None
    atexit.register(slab.close)
    return slab


def _create(root: Path, key: str, pages: int) -> int:
    """The slab file, locked, its pages reserved and its header written, under its key."""
    size = _layout(pages)[2]
    building = root / f".{key}"  # not a key until complete: no sweep takes it half made
    fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Reserved now: a page first touched on a full tmpfs would be SIGBUS, not an error.
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, MAGIC + pages.to_bytes(8, "little"), 0)
        os.rename(building, root / key)
    except BaseException:
        os.close(fd)
        building.unlink(missing_ok=True)
        raise
    return fd


def sweep(root: Path) -> list[str]:
    """Unlink the slabs under `root` whose owners are gone (their lock is free); the names."""
    gone = []
    for path in root.glob(f"*{PREFIX}*"):
        if not KEY.fullmatch(path.name.lstrip(".")):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its owner lives
        finally:
            os.close(fd)
        path.unlink(missing_ok=True)
        gone.append(path.name)
    if gone:
        log.info("unlinked %d slabs of processes that ended: %s", len(gone), ", ".join(gone))
    return gone


class Slabs:
    """The slabs this process reads from, mapped once each; thread-safe."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._mapped: collections.OrderedDict[str, _Mapped] = collections.OrderedDict()
        self._lock = threading.Lock()

    def read(self, ref: Ref, what: str, release: bool = True) -> bytes:
        """The bytes `ref` names, copied once, and its block released to its owner (unless
        the owner frees it itself, or another process reads it first: `release` False); a
        block this process cannot read is Unavailable (a server's set-up, never the
        caller's)."""
        data = self.gather([ref], what)
        if release:
            self.release(ref)
        return data

    def gather(self, refs: list[Ref], what: str) -> bytes:
        """The bytes `refs` name, one after another, copied once; their blocks kept."""
        blocks = [self._block(ref, what) for ref in refs]
        data = b"".join(
            mapped.data[ref.offset : ref.offset + ref.size].data for ref, mapped in blocks
        )
        for ref, mapped in blocks:
            self._still(ref, mapped, what)
        return data

    def check(self, ref: Ref, what: str) -> None:
        """Unavailable unless this process can open `ref`'s slab and the ref lies within it,
        without reading it: for a ref passed on (its reader checks the block's generation)."""
        self._block(ref, what)

    def release(self, ref: Ref) -> None:
        """Give `ref`'s block back to its owner (again: nothing)."""
        mapped = self._mapped.get(ref.key)
        if mapped is not None and 0 <= ref.offset // PAGE < mapped.pages:
            mapped.releases[ref.offset // PAGE] = ref.generation

    def _block(self, ref: Ref, what: str) -> tuple[Ref, _Mapped]:
        mapped = self._open(ref.key, what)
        if ref.offset < 0 or ref.size <= 0 or ref.pages()[1] > mapped.pages:
            raise Unavailable(f"{what}: {shown(ref.text())} lies outside its slab")
        return ref, mapped

    @staticmethod
    def _still(ref: Ref, mapped: _Mapped, what: str) -> None:
        """SlabLost unless every page of `ref`'s bytes still has its generation (checked
        after copying: a block taken again meanwhile is refused, never read as its own)."""
        start, end = ref.pages()
        generations = mapped.generations[start:end]
        if ref.generation <= 0 or not (generations == ref.generation).all():
            raise SlabLost(
                f"{what}: its block in shared memory slab {shown(ref.key)} was taken again "
                "before it was read (its lease ran out: server.slab.lease_seconds)"
            )

    def _open(self, key: str, what: str) -> _Mapped:
        mapped = self._mapped.get(key)
        if mapped is not None:
            return mapped
        with self._lock:
            mapped = self._mapped.get(key) or self._map(key, what)
            self._mapped[key] = mapped
            while len(self._mapped) > MAX_MAPPED:
                self._mapped.popitem(last=False)
            return mapped

    def _map(self, key: str, what: str) -> _Mapped:
        if not KEY.fullmatch(key):
            raise Unavailable(f"{what}: {shown(key)} names no Strata slab")
        try:
            fd = os.open(self._root / key, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise Unavailable(
                f"{what}: {SHARED_MEMORY} {shown(key)} under {self._root} "
                f"({exc.strerror}): the sender and this process must share that folder "
                "(one host, one /dev/shm), or set server.slab.enabled false"
            ) from None
        try:
            return _Mapped(fd, os.fstat(fd).st_size)
        except ValueError as exc:
            raise Unavailable(f"{what}: shared memory slab {shown(key)}: {exc}") from None
        finally:
            os.close(fd)
