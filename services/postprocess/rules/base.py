"""The registry that builds rules from config, and what built-in rules share.

The rule interface (`Rule`, `RuleContext`, `RuleTimeout`) and its helpers are public, in
strata.plugins: the built-in rules use the same API as the user's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import yaml

from strata import yamltext
from strata.config import postprocess as options
from strata.config.postprocess import RuleSpec
from strata.errors import NotReady
from strata.plugins import Rule
from strata.registry import Registry, guard_rule

__all__ = ["RULES", "Misconfigured", "OneInput", "is_bounded", "load_list"]


class Misconfigured(NotReady):
    """The pipeline's rules do not fit what the model returned; the message says how."""


def is_bounded(rule: Rule) -> bool:
    """Whether a built-in `rule` declares itself bounded (class attribute `bounded = True`):
    its cost follows its input's size and it can neither block nor run away (no I/O, no
    regex, no user callback), so a chain of such rules over a small input runs on the event
    loop, without the hand-off to a worker thread that would cost more than the rules. A
    plugin is never bounded (its guard does not say so)."""
    return bool(getattr(rule, "bounded", False))


RULES: Registry[RuleSpec, Rule] = Registry("postprocess rule", options.Rule, Rule, guard_rule)


class _Reads(Protocol):
    input: str


class OneInput:
    """A built-in rule that reads one tensor: its options' `input`."""

    options: _Reads  # the rule's spec (a dataclass field of the rule)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)


def load_list(path: Path, what: str, key: str | None = None) -> list[str]:
    """A list of strings from .txt (one a line), .json or .yaml (a list, or a mapping's `key`)."""
    if not path.is_file():
        raise ValueError(f"{what} file {path} not found")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        body: Any = text.splitlines()
    elif path.suffix == ".json":
        body = json.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        try:
            body = yamltext.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{what} file {path.name} is not valid YAML: {exc}") from None
    else:
        raise ValueError(f"{what} file {path.name}: use .txt, .json or .yaml")
    if isinstance(body, dict) and key is not None:
        body = body.get(key)
    if not isinstance(body, list) or not body or not all(isinstance(v, str) for v in body):
        where = f" (or a mapping with {key!r})" if key else ""
        raise ValueError(f"{what} file {path.name} must hold a non-empty list of strings{where}")
    if "" in body:
        raise ValueError(f"{what} file {path.name}: entry {body.index('')} is empty")
    return body
