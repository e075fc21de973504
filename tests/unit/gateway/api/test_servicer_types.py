"""Each servicer method's annotations name the messages its proto says the call takes and
gives. mypy cannot tell: the generated servicer base classes are untyped, so a method typed
with another call's request would pass it wherever the two messages share the fields read."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from types import ModuleType

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor

from services.gateway.api.admin import AdminServicer
from services.gateway.api.servicer import GatewayServicer
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import admin_pb2

SERVICERS = [(GatewayServicer, v2, "GRPCInferenceService"), (AdminServicer, admin_pb2, "Admin")]


def typed_methods(servicer: type, module: ModuleType, service: str) -> list[MethodDescriptor]:
    """The service's methods the servicer defines itself (not those answered UNIMPLEMENTED
    for it, which take any call)."""
    methods = module.DESCRIPTOR.services_by_name[service].methods
    return [
        method
        for method in methods
        if method.name in vars(servicer)
        and getattr(servicer, method.name).__module__ == servicer.__module__
    ]


def expected(method: MethodDescriptor, module: ModuleType) -> dict[str, object]:
    """The annotations the call's messages give: a streaming side as an async iterator."""
    request = getattr(module, method.input_type.name)
    response = getattr(module, method.output_type.name)
    takes = (
        {"requests": AsyncIterator[request]} if method.client_streaming else {"request": request}
    )
    gives = AsyncIterator[response] if method.server_streaming else response
    return {**takes, "context": grpc.aio.ServicerContext[request, response], "return": gives}


@pytest.mark.parametrize(("servicer", "module", "service"), SERVICERS)
def test_every_method_is_annotated_with_its_calls_messages(
    servicer: type, module: ModuleType, service: str
) -> None:
    methods = typed_methods(servicer, module, service)
    assert methods, f"{servicer.__name__} defines none of {service}'s methods"
    for method in methods:
        hints = typing.get_type_hints(getattr(servicer, method.name))
        hints.pop("self", None)
        assert hints == expected(method, module), method.name
