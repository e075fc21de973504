"""The launcher's restart backoff: doubling while an instance keeps failing, reset once it
has run long enough; and how it names an exit."""

from strata.launch import Backoff, exit_reason


def test_backoff_doubles_up_to_its_ceiling_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(first=0.5, longest=4.0, healthy_after=60.0)
    delays, previous = [], 0.0
    for _ in range(6):
        previous = backoff.after(previous, ran=1.0)
        delays.append(previous)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.after(4.0, ran=61.0) == 0.5


def test_exit_reasons_name_the_signal() -> None:
    assert exit_reason(-9) == "was killed by SIGKILL"
    assert exit_reason(3) == "exited with 3"


def test_exit_reasons_say_why_a_restart_cannot_help() -> None:
    assert exit_reason(78) == "exited with 78 (the config is missing, unreadable or invalid)"
