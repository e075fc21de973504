"""Output formatting: one string per row (BYTES [batch]), as JSON or from a template.

`fields` maps a name in the output to a tensor; each row's value is that tensor's row, a
scalar when the row holds one element, else a list. Strings are decoded from UTF-8 (invalid
bytes become U+FFFD), and NaN or infinite numbers become JSON null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.postprocess.rules.base import RULES, Misconfigured
from strata.config.postprocess import FormatRule
from strata.errors import InvalidArgument
from strata.plugins import RuleContext, take
from strata.wire.codec import Arrays


@RULES.register("format")
@dataclass
class Format:
    options: FormatRule

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.options.fields.values())

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        fields, kind = self.options.fields, self.options.kind
        columns = {key: take(tensors, tensor, kind) for key, tensor in fields.items()}
        rows = _batch_size(columns, fields)
        out = np.empty(rows, dtype=object)
        for row in range(rows):
            values = {key: _plain(column[row]) for key, column in columns.items()}
            out[row] = self._render(values).encode("utf-8")
        return {**tensors, self.options.output: out}

    def _render(self, values: dict[str, Any]) -> str:
        if self.options.style == "json":
            return json.dumps(values, ensure_ascii=False, separators=(",", ":"))
        template = self.options.template
        try:
            return template.format_map(values)
        except (ValueError, TypeError) as exc:
            raise Misconfigured(
                f"{self.options.kind}: template {template!r} failed: {exc}"
            ) from None


def _batch_size(columns: Mapping[str, np.ndarray], fields: Mapping[str, str]) -> int:
    sizes = {key: (column.shape[0] if column.ndim else -1) for key, column in columns.items()}
    if any(size < 0 for size in sizes.values()):
        raise InvalidArgument(f"format needs batch-first tensors; got a scalar among {fields}")
    if len(set(sizes.values())) > 1:
        raise InvalidArgument(f"format: tensors disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def _plain(row: Any) -> Any:
    """A row as JSON-ready Python values: one element unwrapped, bytes as text."""
    values = row.tolist() if isinstance(row, np.ndarray) else row
    if isinstance(values, list) and len(values) == 1:
        values = values[0]
    return _clean(values)


def _clean(value: Any) -> Any:
    if isinstance(value, list):
        return [_clean(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
