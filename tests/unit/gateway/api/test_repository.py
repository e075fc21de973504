"""A pipeline's repository index entries, from each inference deployment's own index."""

from __future__ import annotations

from services.gateway.api.repository import Behind, ModelIndex, _entry

INDEX = [
    ModelIndex(name="digits", version="1", state="READY"),
    ModelIndex(name="digits", version="2", state="READY"),
    ModelIndex(name="digits", version="3", state="UNAVAILABLE", reason="validation failed"),
    ModelIndex(name="tabular", version="7", state="READY"),
]


def test_a_pinned_version_reports_its_own_state() -> None:
    entry = _entry("p", Behind("arm canary", "digits", "b", "3"), INDEX)
    assert (entry.name, entry.version, entry.state) == ("p", "3", "UNAVAILABLE")
    assert entry.reason == (
        "arm canary: model digits version 3 on inference deployment b: validation failed"
    )


def test_the_latest_is_the_newest_ready_version() -> None:
    entry = _entry("p", Behind("shadow", "digits", "a", ""), INDEX)
    assert (entry.version, entry.state) == ("2", "READY")
    assert entry.reason == "shadow: model digits version latest on inference deployment a"


def test_a_version_the_deployment_lacks_is_unavailable() -> None:
    entry = _entry("p", Behind("arm a", "digits", "a", "9"), INDEX)
    assert entry.state == "UNAVAILABLE"
    assert entry.reason.endswith("not in that deployment's repository")


def test_a_deployment_that_did_not_answer_is_unavailable_with_its_reason() -> None:
    entry = _entry("p", Behind("arm a", "digits", "a", "1"), "inference deployment 'a': down")
    assert (entry.state, entry.reason) == ("UNAVAILABLE", "inference deployment 'a': down")


def test_a_later_stage_s_model_is_looked_up_by_its_own_name() -> None:
    entry = _entry("cascade", Behind("stage large arm a", "tabular", "a", ""), INDEX)
    assert (entry.name, entry.version, entry.state) == ("cascade", "7", "READY")
    assert (
        entry.reason == "stage large arm a: model tabular version latest on inference deployment a"
    )
