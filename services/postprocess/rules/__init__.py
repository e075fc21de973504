"""Postprocess rules: small named functions from tensors to tensors, built from config."""

# Importing each module registers its rules.
from services.postprocess.rules import classify, embed, filters, format, merge  # noqa: F401
from services.postprocess.rules.base import RULES, is_bounded
from strata.plugins import Rule, RuleContext, RuleTimeout

build_rule = RULES.build
build_rule_options = RULES.build_options

__all__ = [
    "RULES",
    "Rule",
    "RuleContext",
    "RuleTimeout",
    "build_rule",
    "build_rule_options",
    "is_bounded",
]
