"""A cascade whose default measure sends every validation row to its large model, with real
processes: the gateway starts, serves, and its log says which measure the condition took and
that it tells none of the rows apart, once for each gateway process started."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import free_port, running_system

STAGE = {
    "name": "large",
    "model": {"name": "digits-large"},
    "inputs": {"pixels": "pixels"},
    "when": {"tensor": "logits", "below": 1.0},  # top_probability is never 1: every row
}
WARNING = (
    "pipeline 'digits-cascade': stage 'large' runs when top_probability (the default "
    "measure) of 'logits' is below 1.0, which sends all of the 21 rows of model 'digits' "
    "version 1's validation cases to it; no measure tells them apart at this bound: check "
    "the bound"
)


def test_the_gateway_warns_of_a_default_measure_that_sends_every_row(tmp_path: Path) -> None:
    """The start loses the gateway's REST port to another program, as a start on fresh
    ports can on a busy machine: that gateway warns before it binds, and the start is tried
    again on new ports. Each gateway process started warns once, in its own log: a lost
    attempt's logs are set aside, so the log folder's is the serving gateway's."""
    with (
        another_programs_address() as lost,
        running_system(tmp_path, changes(tmp_path, lost)) as system,
    ):
        gateway = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        request = codec.build_request("digits-cascade", {"images": np.zeros((1, 8, 8), np.uint8)})
        answer = gateway.ModelInfer(request, timeout=10)
        serving = warned(system.log_dir / "gateway.log")
    aside = sorted(tmp_path.glob("attempt-*/gateway.log"))
    lost_there = [log for log in aside if lost_in(log, lost)]
    assert len(lost_there) == 1 and warned(lost_there[0]) == [WARNING]
    # Another attempt is one that lost a port to a program not this test's; its gateway
    # may have been stopped before it warned.
    assert all(len(warned(log)) <= 1 for log in aside)
    assert serving == [WARNING]
    assert answer.parameters["strata.stages"].string_param.endswith("large")


def changes(folder: Path, lost: str) -> Callable[[], dict[str, Any]]:
    """The cascade, its gateway's REST address `lost` until a gateway has lost it (another
    process's lost port may stop an attempt before its gateway binds), a free one after."""

    def asked() -> dict[str, Any]:
        lost_yet = any(lost_in(log, lost) for log in folder.glob("attempt-*/gateway.log"))
        rest = f"127.0.0.1:{free_port()}" if lost_yet else lost
        return {
            "services": {"gateway": {"rest": rest}},
            "pipelines": {"digits-cascade": {"stages": [STAGE]}},
        }

    return asked


@contextmanager
def another_programs_address() -> Iterator[str]:
    """A loopback address another program listens on; the kernel chooses its port, so no
    one can take it first."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


def lost_in(log: Path, address: str) -> bool:
    """Whether the gateway whose log this is exited for `address` (REST) in use."""
    return f"gateway: {address} (REST) already in use" in log.read_text()


def warned(log: Path) -> list[str]:
    """The default-measure warnings in a gateway's log."""
    lines = log.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [
        e["msg"] for e in events if e.get("level") == "WARNING" and "default measure" in e["msg"]
    ]
