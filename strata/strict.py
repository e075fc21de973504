"""The base of every config model: unknown keys are mistakes, refused at load time."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
