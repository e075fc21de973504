"""bench.startup's deployment: the default config on free ports, every process's /readyz
reachable (the start itself is measured by running it, not here)."""

from __future__ import annotations

from pathlib import Path

from bench.startup import config_on_free_ports, probes
from strata.config import load_settings

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.yaml"


def test_every_process_gets_ports_of_its_own_and_a_readiness_probe(tmp_path: Path) -> None:
    config = config_on_free_ports(DEFAULT, tmp_path)
    settings, default = load_settings(config), load_settings(DEFAULT)
    watched = probes(config)
    # gateway, two preprocess replicas, postprocess, inference a and b
    assert len(watched) == len(set(watched)) == 6
    assert settings.pipelines.keys() == default.pipelines.keys()
    assert settings.repository == default.repository
    assert settings.services.gateway.listen != default.services.gateway.listen
