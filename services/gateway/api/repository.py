"""Triton's model repository extension at the gateway: pipelines are the models a client
sees, so the index lists each pipeline with the model version behind each of its arms, its
shadow, its later stages' arms and shadows and its fallbacks' arms, and that version's state
on its inference deployment; loading or unloading a pipeline loads or unloads each of its
models on every deployment behind it.

A caller needs the gateway's admin token (`gateway.admin_token`); the gateway then calls each
inference deployment's repository API with inference's own token (`inference.admin_token` or
`inference.admin_token_file` of the same config file), so no client ever holds it. With
`gateway.local_model_control` (local development, every listener on loopback) neither token
is asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import Message

from services.gateway.flow import fallback
from services.gateway.flow.model_stages import later_models
from services.gateway.request import Caller
from services.gateway.runtime import Runtime
from services.gateway.upstream.router import Router
from strata.config.pipelines import ModelRef, Pipeline
from strata.errors import (
    InvalidArgument,
    NotFound,
    NotReady,
    PermissionDenied,
    StrataError,
    Upstream,
    listed,
    shown,
)
from strata.proto.inference import grpc_service_pb2 as v2
from strata.security.bearer import ControlAuth

ModelIndex = v2.RepositoryIndexResponse.ModelIndex
UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class Behind:
    """One place one of a pipeline's models is served: an arm, the shadow, a later stage's
    arm or shadow, or a fallback's arm, on a deployment."""

    # "arm control", "shadow", "stage large arm a", "stage large shadow", "fallback arm a"
    role: str
    model: str
    deployment: str
    version: str  # "" for the latest


class Repository:
    def __init__(self, runtime: Runtime, auth: ControlAuth) -> None:
        self._runtime = runtime
        self._auth = auth

    async def index(self, caller: Caller, ready_only: bool) -> v2.RepositoryIndexResponse:
        """Every pipeline, one entry per arm and shadow; a deployment that cannot answer
        shows as UNAVAILABLE with the reason, the rest of the index still answers."""
        self._allow(caller)
        settings = self._runtime.settings
        token = self._inference_token()
        deployments = sorted(settings.services.inference)
        found = await asyncio.gather(
            *(self._deployment_index(each, caller, token) for each in deployments)
        )
        indexes = dict(zip(deployments, found, strict=True))
        entries = [
            _entry(name, behind, indexes[behind.deployment])
            for name, pipeline in sorted(settings.pipelines.items())
            for behind in self._behind(name, pipeline)
        ]
        return v2.RepositoryIndexResponse(
            models=[e for e in entries if e.state == "READY" or not ready_only]
        )

    async def load(self, caller: Caller, name: str, parameters: object) -> None:
        """Load (or reload) pipeline `name`'s model on every deployment behind it."""
        self._allow(caller)
        if parameters:
            raise InvalidArgument(
                "load parameters are not supported: a model's settings and files come from "
                "its folder in the repository (model.yaml)"
            )
        await self._everywhere(name, caller, "RepositoryModelLoad", v2.RepositoryModelLoadRequest)

    async def unload(self, caller: Caller, name: str) -> None:
        """Unload pipeline `name`'s model on every deployment behind it (a pipeline has no
        dependents, so Triton's unload_dependents changes nothing)."""
        self._allow(caller)
        await self._everywhere(
            name, caller, "RepositoryModelUnload", v2.RepositoryModelUnloadRequest
        )

    def _allow(self, caller: Caller) -> None:
        """The caller holds the gateway's admin token, on a port where the admin token may
        be checked: with `admin_listen` the token stays off the public port, and so does
        repository control."""
        settings = self._runtime.settings
        if settings.services.gateway.admin_listen is not None:
            raise PermissionDenied(
                "model repository control is off on the public port: services.gateway."
                "admin_listen keeps the admin token off it; an operator calls each inference "
                "deployment's repository API directly, with inference.admin_token"
            )
        if not settings.gateway.local_model_control:
            self._auth.allow(caller.peer, caller.metadata)

    def _behind(self, name: str, pipeline: Pipeline) -> list[Behind]:
        behind = _served("", pipeline.model, self._runtime.router(name))
        for label, later in later_models(pipeline):
            router = self._runtime.stage_routers[name, label]
            behind += _served(f"{_role(pipeline, label)} ", later, router)
        return behind

    async def _everywhere(
        self, name: str, caller: Caller, method: str, request: type[Message]
    ) -> None:
        """`method` for each of the pipeline's models on each deployment behind it, at once;
        the first failure, naming its deployment, once all have answered."""
        pipelines = self._runtime.settings.pipelines
        pipeline = pipelines.get(name)
        if pipeline is None:
            raise NotFound(f"unknown model {shown(name)}; pipelines: {listed(pipelines)}")
        places = sorted({(b.deployment, b.model) for b in self._behind(name, pipeline)})
        token = self._inference_token()
        outcomes = await asyncio.gather(
            *(
                self._call(deployment, caller, token, method, request(model_name=model))
                for deployment, model in places
            ),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _deployment_index(
        self, deployment: str, caller: Caller, token: str | None
    ) -> list[ModelIndex] | str:
        """The deployment's index, or why it has none."""
        try:
            request = v2.RepositoryIndexRequest()
            reply = await self._call(deployment, caller, token, "RepositoryIndex", request)
        except StrataError as exc:
            return str(exc)
        assert isinstance(reply, v2.RepositoryIndexResponse)  # what the method answers
        return list(reply.models)

    async def _call(
        self, deployment: str, caller: Caller, token: str | None, method: str, message: object
    ) -> object:
        """`method` on `deployment` with inference's `token` (none under local model
        control), within the caller's budget."""
        call: Callable[..., Awaitable[object]] = getattr(
            self._runtime.upstreams.inference[deployment].stub, method
        )
        remaining = caller.time_remaining
        timeout = remaining or self._runtime.settings.gateway.default_timeout_seconds
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        try:
            return await call(message, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _upstream_error(deployment, exc) from None

    def _inference_token(self) -> str | None:
        """Inference's admin token from the config (its file read now, so a rotated token
        applies); FAILED_PRECONDITION, naming the setting, where there is none; None under
        local model control, where inference asks for none."""
        settings = self._runtime.settings
        if settings.gateway.local_model_control:
            return None
        base = settings.source.parent if settings.source is not None else Path(".")
        try:
            token = settings.inference.with_files(base).admin_token
        except ValueError as exc:
            raise NotReady(f"the gateway cannot read inference's admin token: {exc}") from None
        if token is None:
            raise NotReady(
                "model repository control is off: the gateway calls inference's repository "
                "API with inference.admin_token (or admin_token_file), which is not set"
            )
        return token.get_secret_value()


def _upstream_error(deployment: str, exc: grpc.aio.AioRpcError) -> StrataError:
    """An inference deployment's refusal as the caller should see it: a refused token is
    the gateway's configuration, never the caller's credentials."""
    where = f"inference deployment {deployment!r}"
    if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return NotReady(
            f"{where} refused the gateway's call ({exc.details()}): the gateway and inference "
            "need the same inference.admin_token"
        )
    return Upstream(exc.code(), f"{where}: {exc.details()}")


def _served(role: str, model: ModelRef, router: Router) -> list[Behind]:
    """Where `model` is served: each of `router`'s arms, then its shadow, each `role` first."""
    behind = [
        Behind(
            f"{role}arm {route.arm}", model.name, route.deployment, route.version or model.version
        )
        for route in router.routes
    ]
    if router.shadow is not None:
        shadow = router.shadow
        version = shadow.version or model.version
        behind.append(Behind(f"{role}shadow", model.name, shadow.deployment, version))
    return behind


def _role(pipeline: Pipeline, label: str) -> str:
    """What a later model does in the pipeline, from its label in strata.stages."""
    if label == pipeline.model.name + fallback.SUFFIX:
        return "fallback"
    if label.endswith(fallback.SUFFIX):
        return f"stage {label.removesuffix(fallback.SUFFIX)} fallback"
    return f"stage {label}"


def _entry(name: str, behind: Behind, index: list[ModelIndex] | str) -> ModelIndex:
    """Pipeline `name`'s entry for one place behind it: its model version's state there."""
    where = (
        f"{behind.role}: model {behind.model} version {behind.version or 'latest'} "
        f"on inference deployment {behind.deployment}"
    )
    if isinstance(index, str):
        return ModelIndex(name=name, version=behind.version, state=UNAVAILABLE, reason=index)
    found = _version([e for e in index if e.name == behind.model], behind.version)
    if found is None:
        reason = f"{where}: not in that deployment's repository"
        return ModelIndex(name=name, version=behind.version, state=UNAVAILABLE, reason=reason)
    reason = f"{where}: {found.reason}" if found.reason else where
    return ModelIndex(name=name, version=found.version, state=found.state, reason=reason)


def _version(entries: list[ModelIndex], version: str) -> ModelIndex | None:
    """The entry of `version`; for "" (the latest), the newest ready one, else the newest."""
    if version:
        return next((e for e in entries if e.version == version), None)
    newest = sorted(entries, key=lambda e: (e.state == "READY", _number(e.version)))
    return newest[-1] if newest else None


def _number(version: str) -> int:
    return int(version) if version.isdigit() else -1
