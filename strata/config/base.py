"""What every config module shares: the strict base model and a few field types."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr


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


def _empty_is_unset(token: SecretStr | None) -> SecretStr | None:
    return token if token is not None and token.get_secret_value() else None


# A control-API token (strata.tokens); unset or empty turns those calls off.
AdminToken = Annotated[SecretStr | None, AfterValidator(_empty_is_unset)]


def host_port(value: str | None) -> str | None:
    """`value` once it is host:port (None passes): ValueError otherwise."""
    if value is None:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"listen address {value!r} must be host:port")
    return value
