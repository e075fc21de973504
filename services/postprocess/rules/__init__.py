"""Postprocess rules: small named functions from tensors to tensors, built from config."""

from services.postprocess.rules import classify  # noqa: F401  (registers the rules)
from services.postprocess.rules.base import RULES, Rule

build_rule = RULES.build

__all__ = ["RULES", "Rule", "build_rule"]
