"""Triton's system shared memory extension: a client on the gateway's host registers a region
of a POSIX shared memory object (its key, an offset and a size), then sends inputs from it and
asks for outputs into it, by region name, offset and size, instead of in the message.

Regions belong to the client that registered them (its identity, door/admission.py):
no other client can see, use or unregister them. Everything is checked before a byte is read:
the key names a plain object under the configured root, the region lies within the object and
the limits, a tensor's bytes lie within its region and match what its shape declares. Bytes are
read and written with pread/pwrite, never mapped, so an object a client shrinks afterwards
fails that request instead of the process (a mapped page past a file's end is SIGBUS).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from strata.config.gateway import SharedMemory as Settings
from strata.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    Unavailable,
    Unimplemented,
    shown,
)
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec, limits

KEY = re.compile(r"/?[A-Za-z0-9_.-]{1,250}")
MAX_NAME = 256
CUDA_HINT = (
    "CUDA shared memory is not offered (the gateway holds no GPU memory of its own): register "
    "system shared memory instead (SystemSharedMemoryRegister, POST "
    "/v2/systemsharedmemory/region/{name}/register)"
)


def no_cuda_regions(name: str, refused: str) -> None:
    """CUDA shared memory at a gateway that holds no GPU memory: an empty registry. For all
    regions (no `name`) a status (none) and an unregister (of none) are true answers, so a
    client that begins by clearing its CUDA regions goes on to system shared memory; a named
    region is none this gateway could hold, and is refused as `refused` (UNIMPLEMENTED), as
    registering one is."""
    if name:
        raise Unimplemented(f"{refused}: {CUDA_HINT}")


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int


class SharedMemory:
    """Every client's registered regions; `settings` read at each call (live reload)."""

    def __init__(self, settings: Callable[[], Settings]) -> None:
        self._settings = settings
        self._regions: dict[str, dict[str, Region]] = {}  # client -> name -> region

    def register(self, client: str, name: str, key: str, offset: int, byte_size: int) -> None:
        settings = self._enabled()
        if not 0 < len(name) <= MAX_NAME:
            raise InvalidArgument(
                f"a shared memory region needs a name of 1 to {MAX_NAME} characters"
            )
        held = self._regions.get(client, {})
        if name in held:
            raise AlreadyExists(f"shared memory region {shown(name)} is registered already")
        if len(held) >= settings.max_regions_per_client:
            raise Overloaded(
                f"this client holds {len(held)} shared memory regions, the most it may "
                "(gateway.shared_memory.max_regions_per_client); unregister one first"
            )
        if sum(len(regions) for regions in self._regions.values()) >= settings.max_regions:
            raise Overloaded("the gateway holds as many shared memory regions as it may")
        if not 0 < byte_size <= settings.max_region_bytes:
            raise InvalidArgument(
                f"shared memory region {shown(name)}: byte_size {byte_size} must be between 1 "
                f"and {settings.max_region_bytes}"
            )
        fd = _open(settings, key, offset + byte_size)
        self._regions.setdefault(client, {})[name] = Region(name, key, offset, byte_size, fd)

    def status(self, client: str, name: str = "") -> list[Region]:
        """The client's regions (only `name`'s, when given: NOT_FOUND if it has none)."""
        self._enabled()
        if name:
            return [self._region(client, name)]
        return sorted(self._regions.get(client, {}).values(), key=lambda r: r.name)

    def unregister(self, client: str, name: str = "") -> None:
        """Forget the client's region `name` (every one of its regions, for none)."""
        self._enabled()
        held = self._regions.get(client, {})
        names = [name] if name else list(held)
        for each in names:
            region = held.pop(each, None)
            if region is not None:
                os.close(region.fd)
        if not held:
            self._regions.pop(client, None)

    def read(self, client: str, name: str, offset: int, size: int, what: str) -> bytes:
        """`size` bytes at `offset` of the client's region `name`, for tensor `what`."""
        region = self._within(client, name, offset, size, what)
        data = os.pread(region.fd, size, region.offset + offset)
        if len(data) != size:
            raise InvalidArgument(f"{what}: shared memory object {shown(region.key)} shrank")
        return data

    def write(self, client: str, name: str, offset: int, size: int, data: bytes, what: str) -> None:
        """`data` into the client's region `name` at `offset`, within the `size` it gave."""
        if len(data) > size:
            raise InvalidArgument(
                f"{what} takes {len(data)} bytes, more than the {size} given for it in shared "
                f"memory region {shown(name)}"
            )
        region = self._within(client, name, offset, size, what)
        os.pwrite(region.fd, data, region.offset + offset)

    def check(self, client: str, name: str, offset: int, size: int, what: str) -> None:
        """That `size` bytes at `offset` lie within the client's region `name`."""
        self._within(client, name, offset, size, what)

    def _within(self, client: str, name: str, offset: int, size: int, what: str) -> Region:
        try:
            region = self._region(client, name)
        except NotFound as exc:
            raise InvalidArgument(f"{what}: {exc}") from None
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise InvalidArgument(
                f"{what}: bytes {offset} to {offset + size} lie outside shared memory region "
                f"{shown(name)} of {region.byte_size} bytes"
            )
        return region

    def _region(self, client: str, name: str) -> Region:
        region = self._regions.get(client, {}).get(name)
        if region is None:
            raise NotFound(f"no shared memory region {shown(name)} is registered by this client")
        return region

    def _enabled(self) -> Settings:
        settings = self._settings()
        if not settings.enabled:
            raise PermissionDenied(
                "system shared memory is off on this gateway: an operator may set "
                "gateway.shared_memory.enabled for clients on its host; send tensors in the "
                "request instead"
            )
        return settings


def _open(settings: Settings, key: str, end: int) -> int:
    """A descriptor of the plain object `key` under the root, which must hold `end` bytes."""
    if not KEY.fullmatch(key) or key.strip("/") in (".", ".."):
        raise InvalidArgument(
            f"shared memory key {shown(key)} must be a name like /input0 (letters, digits, "
            "'_', '.', '-')"
        )
    path = settings.root / key.lstrip("/")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotFound(f"no shared memory object {shown(key)} on the gateway's host") from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise InvalidArgument(f"shared memory object {shown(key)}: {exc.strerror}") from None
        raise Unavailable(f"the gateway cannot open shared memory now: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < end:
        os.close(fd)
        raise InvalidArgument(
            f"shared memory object {shown(key)} has {info.st_size} bytes; the region needs {end}"
        )
    return fd


REGION = "shared_memory_region"
SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


@dataclass(frozen=True)
class Placement:
    """Where a tensor lies in a client's shared memory."""

    region: str
    offset: int
    size: int


def placement(parameters: Mapping[str, v2.InferParameter], what: str) -> Placement | None:
    """A tensor's shared memory parameters (None when it has none), each checked."""
    if REGION not in parameters:
        return None
    region = parameters[REGION]
    if region.WhichOneof("parameter_choice") != "string_param" or not region.string_param:
        raise InvalidArgument(f"{what}: {REGION} must be a region's name")
    return Placement(
        region.string_param, _integer(parameters, OFFSET, what, 0), _integer(parameters, SIZE, what)
    )


def _integer(
    parameters: Mapping[str, v2.InferParameter], key: str, what: str, default: int | None = None
) -> int:
    value = parameters.get(key)
    if value is None and default is not None:
        return default
    kind = value.WhichOneof("parameter_choice") if value is not None else None
    number = getattr(value, kind) if kind in ("int64_param", "uint64_param") else -1
    if number < 0:
        raise InvalidArgument(f"{what}: {key} must be a non-negative integer")
    return number


def with_inputs(
    memory: SharedMemory, client: str, request: v2.ModelInferRequest
) -> v2.ModelInferRequest:
    """`request` with the bytes of each input it placed in shared memory read into
    raw_input_contents beside the others (which tritonclient sends raw, without an entry
    for the placed ones); the request itself when it placed none."""
    if not any(REGION in t.parameters for t in request.inputs):
        return request  # the usual request, which pays for no names in messages unsent
    places = [placement(t.parameters, f"input {shown(t.name)}") for t in request.inputs]
    raw = list(request.raw_input_contents)
    if len(raw) != places.count(None):
        raise InvalidArgument(
            f"{places.count(None)} inputs are not in shared memory but raw contents has "
            f"{len(raw)} entries: send those inputs as raw contents"
        )
    out = v2.ModelInferRequest()
    out.CopyFrom(request)
    del out.raw_input_contents[:]
    others = iter(raw)
    for tensor, place in zip(request.inputs, places, strict=True):
        if place is None:
            out.raw_input_contents.append(next(others))
            continue
        limits.check_declared(tensor.name, tensor.datatype, tensor.shape, place.size)
        what = f"input {shown(tensor.name)}"
        out.raw_input_contents.append(
            memory.read(client, place.region, place.offset, place.size, what)
        )
    return out


def output_places(
    memory: SharedMemory, client: str, request: v2.ModelInferRequest
) -> dict[str, Placement]:
    """The requested outputs to be written into shared memory, each checked now, before
    any work: its region is the client's and the bytes lie within it."""
    places = {}
    for output in request.outputs:
        what = f"output {shown(output.name)}"
        place = placement(output.parameters, what)
        if place is None:
            continue
        if "classification" in output.parameters:
            raise InvalidArgument(f"{what}: classification answers cannot go to shared memory")
        memory.check(client, place.region, place.offset, place.size, what)
        places[output.name] = place
    return places


def write_outputs(
    memory: SharedMemory, client: str, places: Mapping[str, Placement], outputs: codec.Arrays
) -> dict[str, Placement]:
    """Each placed output's bytes written into its region: where, and how many bytes."""
    written = {}
    for name, place in places.items():
        if name in outputs:
            data = codec.to_raw(outputs[name])
            what = f"output {shown(name)}"
            memory.write(client, place.region, place.offset, place.size, data, what)
            written[name] = Placement(place.region, place.offset, len(data))
    return written
