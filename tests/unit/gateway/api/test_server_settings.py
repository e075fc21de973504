"""Triton's log switches against Python's levels, and what cannot change."""

from __future__ import annotations

import logging

import pytest

from services.gateway.api.server_settings import _check, _level
from strata.errors import InvalidArgument

OFF = {"log_info": False, "log_warning": False, "log_error": False, "log_verbose_level": 0}


@pytest.mark.parametrize(
    ("switches", "level"),
    [
        ({"log_verbose_level": 1}, logging.DEBUG),
        ({"log_info": True}, logging.INFO),
        ({"log_warning": True, "log_error": True}, logging.WARNING),
        ({"log_error": True}, logging.ERROR),
        ({}, logging.CRITICAL),
        ({"log_info": True, "log_error": False}, logging.INFO),  # levels nest: the lowest wins
    ],
)
def test_the_lowest_switch_on_sets_the_level(switches: dict, level: int) -> None:
    assert _level(OFF | switches) == level


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("log_colour", True, "unknown log setting 'log_colour'"),
        ("log_info", 1, "log_info must be of type bool"),
        ("log_verbose_level", True, "log_verbose_level must be of type int"),
        ("log_format", "ISO8601", "log_format cannot change"),
    ],
)
def test_what_cannot_be_set_is_refused(key: str, value, words: str) -> None:
    current = {"log_file": "", "log_format": "json", **OFF}
    with pytest.raises(InvalidArgument, match=words):
        _check(key, value, current)
