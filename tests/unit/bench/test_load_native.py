"""Which sender sends a plan: the compiled one only where it can, and a clear no otherwise."""

from dataclasses import replace

import pytest

from bench.load import native
from bench.load.schedule import Plan
from bench.load.transport import Tls

GRPC = Plan(
    target="127.0.0.1:1", method="/inference.GRPCInferenceService/ModelInfer", requests=(b"",)
)
HTTP = replace(GRPC, target="http://127.0.0.1:1", method="/v2/models/m/infer")
TLS = replace(GRPC, tls=Tls())


@pytest.mark.parametrize("plan", [HTTP, TLS], ids=["http", "tls"])
def test_what_the_compiled_sender_cannot_send_goes_through_python(plan: Plan) -> None:
    assert native.resolve(plan).sender == "python"
    with pytest.raises(ValueError, match="the compiled sender cannot send this run"):
        native.resolve(replace(plan, sender="compiled"))
    assert "through Python" in native.described(plan)


def test_python_when_asked_and_an_unknown_sender_refused() -> None:
    assert native.resolve(replace(GRPC, sender="python")).sender == "python"
    assert "--sender python" in native.described(replace(GRPC, sender="python"))
    with pytest.raises(ValueError, match="unknown sender 'rust'"):
        native.resolve(replace(GRPC, sender="rust"))
