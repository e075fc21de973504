"""The gateway's hops and slabs: preprocess's refs checked as the answer arrives and passed on
to inference as they are, read into bytes only where something reads them, released once the
flight is done (and no more asking once a slab cannot be opened); preprocess's photos and
inference's inputs placed only once the layer said it shares the slab, freed when the call
ends, and learnt again after a failed call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.gateway.upstream import split
from services.gateway.upstream.slabs import InferenceSlabs, Passed, ProcessSlabs
from strata.errors import Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.slab import ASK, PAGE, READS, REFS, SHARED_MEMORY, Slab, domain

CROP = np.arange(3 * PAGE, dtype=np.uint32).astype(np.uint8)


def _call() -> v1.ProcessRequest:
    return v1.ProcessRequest(requests=[v1.Request(id="1", pipeline="images")])


def _answer(slab: Slab) -> v1.ProcessResponse:
    reply = v1.ProcessResponse()
    tensor = reply.results.add().tensors.add(name="crop", datatype="UINT8", shape=[len(CROP)])
    ref = slab.place(CROP)
    assert ref is not None
    tensor.slab = ref.text()
    return reply


def test_preprocess_refs_pass_on_are_read_where_needed_and_go_back_when_released(
    tmp_path: Path,
) -> None:
    passed = Passed(tmp_path)
    hop, sender = ProcessSlabs("preprocess", passed), Slab(tmp_path, "t", 4 * PAGE, 1, 30)
    request = _call()
    with hop.carrying(request):
        pass
    assert request.requests[0].parameters[ASK] == domain(tmp_path)
    (tensor,) = hop.answered(_answer(sender)).results[0].tensors
    assert tensor.slab and not tensor.data  # passed on as it came
    (read,) = passed.read([tensor])
    assert read.data == CROP.tobytes() and not read.slab and list(read.shape) == [len(CROP)]
    assert sender.place(np.ones(4 * PAGE, np.uint8)) is None  # still the flight's
    passed.release([tensor])
    passed.release([tensor])  # again: nothing
    assert sender.place(np.ones(4 * PAGE, np.uint8)) is not None  # released: all room again
    sender.close()


def test_a_slab_that_cannot_be_opened_is_unavailable_and_the_hop_asks_no_more(
    tmp_path: Path,
) -> None:
    hop, sender = (
        ProcessSlabs("preprocess", Passed(tmp_path)),
        Slab(tmp_path, "t", 4 * PAGE, 1, 30),
    )
    reply = _answer(sender)
    sender.close()  # unlinked: as if another /dev/shm
    with pytest.raises(Unavailable, match="cannot open shared memory slab"):
        hop.answered(reply)
    request = _call()
    request.requests[0].parameters[ASK] = "asked before"
    with hop.carrying(request):
        pass
    assert ASK not in request.requests[0].parameters


def _photos() -> v1.ProcessRequest:
    request = _call()
    request.requests[0].tensors.add(name="image", datatype="BYTES", shape=[1], data=CROP.tobytes())
    request.requests[0].tensors.add(name="small", datatype="BYTES", shape=[1], data=b"abcd")
    return request


def _reads(reads: bool) -> v1.ProcessResponse:
    reply = v1.ProcessResponse()
    if reads:
        reply.results.add().info[ASK] = READS
    return reply


def test_preprocess_requests_go_through_the_slab_once_preprocess_said_it_reads_it(
    tmp_path: Path,
) -> None:
    slab = Slab(tmp_path, "gateway", 3 * PAGE, PAGE, 30)
    hop = ProcessSlabs("preprocess", Passed(tmp_path), slab)
    first = _photos()
    with hop.carrying(first):
        assert [t.data for t in first.requests[0].tensors] == [CROP.tobytes(), b"abcd"]
    hop.answered(_reads(True))
    second = _photos()
    with hop.carrying(second):
        big, small = second.requests[0].tensors
        assert not big.data and big.slab and small.data == b"abcd" and not small.slab
        assert slab.place(CROP) is None  # the block is the call's while it lasts
    assert slab.place(CROP) is not None  # freed when the call ended
    hop.answered(_reads(False))
    third = _photos()
    with hop.carrying(third):
        assert not any(t.slab for t in third.requests[0].tensors)
    slab.close()


def _infer() -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="vision")
    request.inputs.add(name="crops", datatype="UINT8", shape=[len(CROP)])
    request.inputs.add(name="small", datatype="UINT8", shape=[4])
    request.raw_input_contents.extend([CROP.tobytes(), b"abcd"])
    return request


def _said(shares: bool) -> v2.ModelInferResponse:
    reply = v2.ModelInferResponse()
    reply.parameters[ASK].bool_param = shares
    return reply


def test_inference_inputs_go_through_the_slab_once_the_deployment_said_it_reads_it(
    tmp_path: Path,
) -> None:
    slab = Slab(tmp_path, "gateway", 3 * PAGE, PAGE, 30)
    hop = InferenceSlabs(Passed(tmp_path), slab)
    first = _infer()
    with hop.carrying(first):
        assert list(first.raw_input_contents) == [CROP.tobytes(), b"abcd"]  # not yet learnt
    assert first.parameters[ASK].string_param == slab.domain
    hop.answered(_said(True))
    second = _infer()
    with hop.carrying(second):
        assert list(second.raw_input_contents) == [b"", b"abcd"]
        assert ASK in second.inputs[0].parameters and ASK not in second.inputs[1].parameters
        assert slab.place(CROP) is None  # the block is the call's while it lasts
    assert slab.place(CROP) is not None  # freed when the call ended
    slab.close()


@pytest.mark.parametrize("layer", ["preprocess", "inference"])
def test_a_failed_call_with_inputs_in_the_slab_learns_again_or_stops_placing(
    tmp_path: Path, layer: str
) -> None:
    """A call that failed with blocks placed: the hop learns again whether the layer reads
    them; one whose layer said it cannot open the slab places nothing more."""
    slab = Slab(tmp_path, "gateway", 8 * PAGE, PAGE, 30)
    hop: ProcessSlabs | InferenceSlabs
    if layer == "preprocess":
        hop = ProcessSlabs("preprocess", Passed(tmp_path), slab)
        call, said = _photos, _reads
    else:
        hop, call, said = InferenceSlabs(Passed(tmp_path), slab), _infer, _said
    with pytest.raises(Unavailable), hop.carrying(call()):  # nothing placed yet
        raise Unavailable(f"{layer}: refused")
    assert not hop.shares  # a failure teaches nothing
    hop.answered(said(True))  # type: ignore[arg-type]
    with pytest.raises(Unavailable), hop.carrying(call()):  # type: ignore[arg-type]
        raise Unavailable(f"{layer}: draining")
    assert not hop.shares and hop.placing  # a passing fault: learnt again
    hop.answered(said(True))  # type: ignore[arg-type]
    assert hop.shares
    with pytest.raises(Unavailable), hop.carrying(call()):  # type: ignore[arg-type]
        raise Unavailable(f"input 'x': {SHARED_MEMORY} {slab.key!r}: no such file")
    hop.answered(said(True))  # type: ignore[arg-type]
    assert not hop.shares and not hop.placing  # its set-up cannot work: bytes for good
    assert slab.place(np.ones(8 * PAGE, np.uint8)) is not None  # every block was freed
    slab.close()


def _passed_on(named: str) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="vision")
    crops = request.inputs.add(name="crops", datatype="UINT8", shape=[2 * len(CROP)])
    crops.parameters[ASK].string_param = named
    request.raw_input_contents.append(b"")
    return request


def test_inputs_that_name_preprocess_blocks_go_as_they_are_only_to_a_deployment_that_shares(
    tmp_path: Path,
) -> None:
    """A crop stacked from two parts' blocks names both; a deployment that reads this host's
    slabs is sent the names, any other the bytes, and the blocks stay the flight's."""
    sender = Slab(tmp_path, "preprocess", 8 * PAGE, 1, 30)
    first, second = sender.place(CROP), sender.place(CROP[::-1].copy())
    assert first is not None and second is not None
    named = f"{first.text()}{REFS}{second.text()}"
    hop = InferenceSlabs(Passed(tmp_path))  # no slab of its own: it passes on all the same
    request = _passed_on(named)
    with hop.carrying(request):
        assert request.raw_input_contents[0] == CROP.tobytes() + CROP[::-1].tobytes()
        assert ASK not in request.inputs[0].parameters
    hop.answered(_said(True))
    request = _passed_on(named)
    with hop.carrying(request):
        assert request.inputs[0].parameters[ASK].string_param == named
        assert request.raw_input_contents[0] == b""
    assert sender.place(np.ones(4 * PAGE, np.uint8)) is None  # not released by the call
    sender.close()


def _part(slab: Slab | None, rows: int) -> v1.ProcessResponse:
    reply = v1.ProcessResponse()
    result = reply.results.add(id="1")
    result.members.add(rows=rows)
    tensor = result.tensors.add(name="crop", datatype="UINT8", shape=[rows, len(CROP)])
    data = np.tile(CROP, rows)
    if slab is None:
        tensor.data = data.tobytes()
    else:
        ref = slab.place(data)
        assert ref is not None
        tensor.slab = ref.text()
    return reply


def test_parts_answered_by_ref_merge_into_one_tensor_naming_every_block(tmp_path: Path) -> None:
    sender = Slab(tmp_path, "preprocess", 16 * PAGE, 1, 30)
    passed = Passed(tmp_path)
    merged = split.merge([_part(sender, 1), _part(sender, 2)], passed)
    assert merged is not None
    (tensor,) = merged.results[0].tensors
    assert list(tensor.shape) == [3, len(CROP)] and tensor.slab.count(REFS) == 1
    (read,) = passed.read([tensor])
    assert read.data == np.tile(CROP, 3).tobytes()
    passed.release([tensor])
    assert sender.place(np.ones(16 * PAGE, np.uint8)) is not None  # both blocks given back
    sender.close()


def test_parts_of_blocks_and_bytes_merge_into_bytes_and_the_blocks_go_back(
    tmp_path: Path,
) -> None:
    """A replica whose slab was full answered bytes: the whole is bytes, read once."""
    sender = Slab(tmp_path, "preprocess", 16 * PAGE, 1, 30)
    merged = split.merge([_part(sender, 2), _part(None, 1)], Passed(tmp_path))
    assert merged is not None
    (tensor,) = merged.results[0].tensors
    assert not tensor.slab and tensor.data == np.tile(CROP, 3).tobytes()
    assert sender.place(np.ones(16 * PAGE, np.uint8)) is not None  # released when read
    sender.close()


def test_a_passed_on_block_whose_owner_went_fails_its_call_and_the_hop_learns_again(
    tmp_path: Path,
) -> None:
    """A preprocess replica killed while its crops were at inference: its slab is gone, so
    inference cannot open it; the hop passes refs on again once the deployment says it reads
    this host's slabs, as it does for any passing fault."""
    sender = Slab(tmp_path, "preprocess", 8 * PAGE, 1, 30)
    crop = sender.place(CROP)
    assert crop is not None
    hop = InferenceSlabs(Passed(tmp_path), Slab(tmp_path, "gateway", 8 * PAGE, PAGE, 30))
    hop.answered(_said(True))
    gone = f"input 'crops': {SHARED_MEMORY} {crop.key!r} under {tmp_path} (no such file)"
    with pytest.raises(Unavailable), hop.carrying(_passed_on(crop.text())):
        raise Unavailable(gone)
    assert not hop.shares and hop.placing
    hop.answered(_said(True))
    request = _passed_on(crop.text())
    with hop.carrying(request):
        assert request.inputs[0].parameters[ASK].string_param == crop.text()
    sender.close()
