"""What the alerts read of the model manager: each version tried counts its refusals at load
(0 until one, so the series exists before it), and each serving version its queue's capacity."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.inference.manager import ModelManager
from services.inference.metrics import watch
from strata.errors import NotReady
from strata.models.normalisation import STATS_FILE, save_stats
from tests.unit.inference.test_inference_repository import X, with_manager
from tests.unit.inference.test_inference_toymodels import dense, write_version
from tests.unit.inference.test_inference_versions import ALL, stats_of


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_refused_version_counts_and_a_served_one_shows_its_queue_capacity(
    tmp_path: Path,
) -> None:
    one, two = stats_of(1), stats_of(2)
    prints = {1: one.fingerprint, 2: two.fingerprint}
    write_version(tmp_path, "toy", 1, dense(1), [X], {**ALL, "preprocess_fingerprint": prints})
    save_stats(one, tmp_path / "toy" / "1" / STATS_FILE)
    failures = "strata_inference_load_failures_total"

    async def body(manager: ModelManager) -> None:
        assert sample(failures, model="toy", version="1") is not None
        before = sample(failures, model="toy", version="2") or 0.0
        write_version(tmp_path, "toy", 2, dense(2), [X])
        save_stats(one, tmp_path / "toy" / "2" / STATS_FILE)  # version 1's: refused
        with pytest.raises(NotReady):
            await manager.load("toy")
        assert sample(failures, model="toy", version="2") == before + 1
        stop = watch(manager.statistics, "a")
        try:
            labels = {"deployment": "a", "model": "toy", "version": "1"}
            assert sample("strata_inference_queue_capacity_rows", **labels) == 300
        finally:
            stop()

    with_manager(tmp_path, body, batching={"max_queue_rows": 300})
