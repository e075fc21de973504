"""What every config module shares: the strict base model and a few field types."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from strata.registry import Family, Plugin

# A setting's json_schema_extra when a config reload applies it to the running gateway
# (the admin API's Reload): `live_fields` lists them, the config reference says so.
LIVE: dict[str, Any] = {"live": True}


def live_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` marked LIVE."""
    return tuple(
        name
        for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("live")
    )


class Strict(BaseModel):
    """The base of every config model: unknown keys are mistakes, refused at load time."""

    model_config = ConfigDict(extra="forbid")


# Step and rule options as YAML writes them: `true` is not 1, and "8" is not 8.
Count = Annotated[int, Field(strict=True, gt=0)]
Number = Annotated[float, Field(strict=True)]
OUTPUT = "Where the result goes; defaults to input."


class _Written(Protocol):
    input: str
    output: str | None


class WritesOutput:
    """A stage's options with an optional `output` (described by OUTPUT) and an `input`."""

    @property
    def target(self: _Written) -> str:
        """The tensor the stage writes: `output`, or its `input` when that is unset."""
        return self.output or self.input


NumericDatatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64",
]  # fmt: skip
Datatype = Literal[NumericDatatype, "BYTES"]


PLUGIN = "<plugin>"  # the tag of a stage whose kind is not a built-in (in errors and docs)
# An import path (package.module:Name) or an entry point's name.
_PLUGIN_KIND = re.compile(r"[A-Za-z_][\w.-]*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")


class PluginStage(BaseModel):
    """A stage whose kind names user code: every key beside the shared ones is the plugin's
    option, validated by the plugin's own `Options` when the service that runs the stage
    loads the config (`plugin`), never where the stage is only carried (the gateway)."""

    family: ClassVar[Family]
    kind: str = Field(
        description="An import path (package.module:Name) or the name of an entry point an "
        "installed package declares; the class it names runs the stage."
    )
    _plugin: Plugin | None = PrivateAttr(default=None)

    @field_validator("kind", check_fields=False)
    @classmethod
    def _names_code(cls, kind: str) -> str:
        if not _PLUGIN_KIND.fullmatch(kind):
            raise ValueError(
                f"{kind!r} is not a built-in {cls.family.what}, an import path "
                "(package.module:Name) or an entry point's name"
            )
        return kind

    @property
    def options(self) -> dict[str, Any]:
        """The plugin's own keys, as written."""
        return dict(self.model_extra or {})

    def __eq__(self, other: object) -> bool:
        """Equal as config: the plugin loaded from it is a cache, not part of it (a reload
        compares stages, and the one that was built has its plugin loaded)."""
        if not isinstance(other, PluginStage):
            return NotImplemented
        mine = (type(self), self.__dict__, self.__pydantic_extra__)
        return mine == (type(other), other.__dict__, other.__pydantic_extra__)

    def plugin(self, repository: Path) -> Plugin:
        """The plugin's class and validated options, imported once (PluginError if not)."""
        if self._plugin is None:
            self._plugin = self.family.load(self.kind, self.options, repository)
        return self._plugin


def kinds(models: tuple[type[BaseModel], ...]) -> frozenset[str]:
    """The kinds of built-in stage models (each declares its kind as a Literal)."""
    return frozenset(map(_kind, models))


def stage_union(models: tuple[type[BaseModel], ...], plugin: type[PluginStage]) -> Any:
    """A stage chosen by `kind`: one of the built-in models, or else a plugin."""
    builtins = kinds(models)

    def kind(value: Any) -> str | None:  # named after the key it reads (config-docs)
        given = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
        if not isinstance(given, str):
            return None
        return given if given in builtins else PLUGIN

    tagged = [Annotated[model, Tag(_kind(model))] for model in models]
    members = Union[(*tagged, Annotated[plugin, Tag(PLUGIN)])]  # type: ignore[valid-type]
    return Annotated[
        members,
        Discriminator(
            kind,
            custom_error_type="missing_kind",
            custom_error_message="a stage needs a 'kind': a built-in, an import path "
            "(package.module:Name) or an entry point's name",
        ),
    ]


def _kind(model: type[BaseModel]) -> str:
    return str(get_args(model.model_fields["kind"].annotation)[0])


MIN_ADMIN_TOKEN = 32  # characters: a guessed or short token is refused at load time


def _admin_token(token: SecretStr | None) -> SecretStr | None:
    """None for unset or empty; ValueError for a token too short to resist guessing."""
    if token is None or not token.get_secret_value():
        return None
    length = len(token.get_secret_value())
    if length < MIN_ADMIN_TOKEN:
        raise ValueError(
            f"an admin token needs at least {MIN_ADMIN_TOKEN} characters, this one has "
            f"{length}; make one with `python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return token


# A control-API token (strata.security.bearer); unset or empty turns those calls off.
AdminToken = Annotated[SecretStr | None, AfterValidator(_admin_token)]
_ADMIN_TOKEN = TypeAdapter(AdminToken)


def read_secret(path: Path, base: Path, setting: str) -> str:
    """The text of a secret file (a mounted Secret), whitespace stripped; a relative `path`
    resolves against `base`. ValueError naming `setting` when it cannot be read."""
    full = path if path.is_absolute() else base / path
    try:
        return full.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {full} ({exc.strerror})") from None


def admin_token_from(path: Path, base: Path, setting: str) -> SecretStr | None:
    """The admin token in the file at `path`, held to the same rules as one set inline."""
    text = read_secret(path, base, setting)
    try:
        return _ADMIN_TOKEN.validate_python(SecretStr(text))
    except ValidationError as exc:
        raise ValueError(f"{setting}: {first_error(exc)}") from None


def first_error(exc: ValidationError) -> str:
    """The first problem of a validation error, where and what, on one line."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def not_both(model: BaseModel, inline: str, file: str) -> None:
    """ValueError when `model` sets both a secret and the file that would hold it."""
    if getattr(model, inline) is not None and getattr(model, file) is not None:
        raise ValueError(f"set {inline} or {file}, not both")


def host_port(value: str | None) -> str | None:
    """`value` once it is host:port (None passes): ValueError otherwise."""
    if value is None:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"listen address {value!r} must be host:port")
    return value


def loopback(address: str) -> bool:
    """Whether a host:port binds a loopback address only (127.0.0.0/8, ::1, localhost)."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, or a wildcard such as 0.0.0.0's spelling by name
        return False
