"""One running system shared by the end-to-end tests of a module, its gateway's address, and
a v2 stub on it."""

import grpc
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from tests.support.fixtures import system as system  # re-exported: pytest finds fixtures here


@pytest.fixture(scope="module")
def gateway(system: Supervisor) -> str:
    return system.address("gateway")


@pytest.fixture(scope="module")
def stub(gateway: str) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(gateway))
