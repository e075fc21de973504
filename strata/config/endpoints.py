"""Where each layer listens, and where its callers reach it."""

from __future__ import annotations

from pydantic import Field, field_validator

from strata.config.base import Strict, host_port


class ServiceEndpoint(Strict):
    """Where one service listens, and where its callers reach it."""

    listen: str = Field(description="host:port the service binds, e.g. 127.0.0.1:8101.")
    target: str | None = Field(
        default=None,
        description="gRPC target callers use (e.g. dns:///preprocess:8101); defaults to the "
        "listen address, or to all local replicas' addresses.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Local processes `make run` starts, on consecutive ports from listen's.",
    )
    metrics: str | None = Field(
        default=None,
        description="host:port of the Prometheus /metrics page (replicas: consecutive ports).",
    )

    @field_validator("listen", "metrics")
    @classmethod
    def _has_port(cls, value: str | None) -> str | None:
        return host_port(value)

    @property
    def listens(self) -> list[str]:
        """The listen address of each local replica."""
        return _consecutive(self.listen, self.replicas)

    def metrics_for(self, listen: str) -> str | None:
        """The metrics address of the replica listening on `listen`."""
        if self.metrics is None:
            return None
        index = self.listens.index(listen) if listen in self.listens else 0
        return _consecutive(self.metrics, index + 1)[-1]

    @property
    def address(self) -> str:
        """What callers dial: gRPC balances over every address of an `ipv4:` target."""
        if self.target:
            return self.target
        if self.replicas == 1:
            return self.listen
        return "ipv4:" + ",".join(self.listens)


class GatewayEndpoint(ServiceEndpoint):
    """The gateway's endpoint: its gRPC port, and the same API over HTTP where set."""

    rest: str | None = Field(
        default=None,
        description="host:port of the KServe v2 REST API (HTTP/JSON, the binary tensor "
        "extension), served by the gateway process beside gRPC; unset: gRPC only.",
    )
    admin_listen: str | None = Field(
        default=None,
        description="host:port of a server of its own for strata.v1.Admin (with health), "
        "kept off the public port: bind it where only operators reach it; unset: the admin "
        "API shares the public gRPC port.",
    )

    @field_validator("rest", "admin_listen")
    @classmethod
    def _extra_has_port(cls, value: str | None) -> str | None:
        return host_port(value)


def _consecutive(address: str, count: int) -> list[str]:
    host, _, port = address.rpartition(":")
    return [f"{host}:{int(port) + i}" for i in range(count)]


class Services(Strict):
    """The layers' endpoints."""

    gateway: GatewayEndpoint = Field(description="The public KServe v2 endpoint.")
    preprocess: ServiceEndpoint = Field(description="The preprocess service (or its replicas).")
    inference: dict[str, ServiceEndpoint] = Field(
        min_length=1,
        description="Inference deployments by name; pipeline routes (A/B arms) name them.",
    )
    postprocess: ServiceEndpoint = Field(description="The postprocess rule engine.")

    @property
    def primary_inference(self) -> ServiceEndpoint:
        """The first inference deployment: where a lone inference process listens."""
        return next(iter(self.inference.values()))

    def endpoint_of(self, listen: str) -> ServiceEndpoint | None:
        """The endpoint one of whose replicas listens on `listen`."""
        endpoints = [self.gateway, self.preprocess, self.postprocess, *self.inference.values()]
        return next((e for e in endpoints if listen in e.listens), None)
