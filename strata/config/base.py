"""What every config module shares: the strict base model and a few field types."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
)


class Strict(BaseModel):
    """The base of every config model: unknown keys are mistakes, refused at load time."""

    model_config = ConfigDict(extra="forbid")


# Step and rule options as YAML writes them: `true` is not 1, and "8" is not 8.
Count = Annotated[int, Field(strict=True, gt=0)]
Number = Annotated[float, Field(strict=True)]
OUTPUT = "Where the result goes; defaults to input."

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


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


# A control-API token (strata.tokens); unset or empty turns those calls off.
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
