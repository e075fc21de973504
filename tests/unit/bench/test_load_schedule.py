"""How a run is shared among workers: one arrival schedule, shares that add up."""

import pytest

from bench.load.schedule import Plan, open_count, share, split

PLAN = Plan(
    target="127.0.0.1:1", method="/inference.GRPCInferenceService/ModelInfer", requests=(b"a", b"b")
)


@pytest.mark.parametrize(("amount", "parts"), [(10, 3), (2, 4), (0, 2), (7, 7)])
def test_shares_add_up_and_differ_by_at_most_one(amount: int, parts: int) -> None:
    shares = [share(amount, parts, i) for i in range(parts)]
    assert sum(shares) == amount
    assert max(shares) - min(shares) <= 1


def test_open_loop_workers_interleave_one_schedule() -> None:
    plan = Plan(**{**PLAN.__dict__, "rps": 100.0, "duration": 0.55, "connections": 3})
    jobs = split(plan, 4)
    sent = sorted(i for job in jobs for i in range(job.offset, job.count, job.stride))
    assert sent == list(range(open_count(plan))) == list(range(55))
    assert [job.connections for job in jobs] == [1, 1, 1, 1]  # at least one each
    assert all(job.concurrency is None for job in jobs)


def test_open_loop_in_flight_cap_is_shared() -> None:
    plan = Plan(**{**PLAN.__dict__, "rps": 10.0, "total": 40, "concurrency": 5})
    jobs = split(plan, 2)
    assert sum(job.concurrency for job in jobs) == 5
    assert all(job.count == 40 for job in jobs)


def test_closed_loop_shares_clients_and_total() -> None:
    plan = Plan(**{**PLAN.__dict__, "concurrency": 5, "total": 11, "connections": 4})
    jobs = split(plan, 3)
    assert sum(job.concurrency for job in jobs) == 5
    assert sum(job.count for job in jobs) == 11
    assert sum(job.connections for job in jobs) == 4


def test_never_more_workers_than_requests_or_clients() -> None:
    assert len(split(Plan(**{**PLAN.__dict__, "total": 2}), 8)) == 2
    assert len(split(Plan(**{**PLAN.__dict__, "concurrency": 1}), 8)) == 1
    closed_by_time = split(Plan(**{**PLAN.__dict__, "duration": 1.0, "concurrency": 3}), 8)
    assert len(closed_by_time) == 3 and all(job.count is None for job in closed_by_time)


def test_a_plan_without_messages_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        split(Plan(**{**PLAN.__dict__, "requests": ()}), 1)
