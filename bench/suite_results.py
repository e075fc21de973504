"""What a suite run measured: its plan, each system run, each pipeline's points."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.admin import Sample
from bench.measure import Point


@dataclass(frozen=True)
class SuitePlan:
    """How long and how hard each part of the suite measures."""

    ceiling_seconds: float  # per batch size
    warmup_seconds: float  # per target, before anything is measured
    capacity_seconds: float  # closed loop
    light_seconds: float
    light_rps: float  # at most; never above a tenth of the pipeline's capacity
    sweep_seconds: float  # per step
    fractions: tuple[float, ...]  # sweep steps, as fractions of the pipeline's capacity
    sweeps: int | None  # how many pipelines are swept (None: all)
    calm_seconds: float  # the longest wait for the ladder to settle before a step
    direct_concurrency: int = 32  # in flight at the inference service (room to batch)
    pipeline_concurrency: int = 16  # in flight at the gateway (well below its limit)
    timeout: float = 10.0


@dataclass
class PipelineRun:
    """One pipeline in one system run."""

    pipeline: str
    model: str
    version: str
    deployment: str
    objective_ms: float
    direct_capacity: Point
    pipeline_capacity: Point
    direct_light: Point
    pipeline_light: Point
    sweep: list[Point] = field(default_factory=list)


@dataclass
class Step:
    """One sweep step on the run's clock, for the plot of the level over time."""

    pipeline: str
    label: str
    offered: float
    start: float  # seconds since the system run began
    end: float


@dataclass
class SystemRun:
    """One start of the system, tracing on or off, and what was measured on it."""

    tracing: bool
    pipelines: list[PipelineRun]
    timeline: list[Sample]
    steps: list[Step]
    began: float  # time.time()
    spans: int = 0  # spans the receiver got (tracing on)
    unsettled: int = 0  # steps that began before the ladder had settled


@dataclass
class Suite:
    """The whole run: the machine, the ceilings, and each system run."""

    machine: str
    config: str
    mode: str
    plan: SuitePlan
    ceilings: dict[str, dict[int, float]]  # pipeline -> batch size -> rows per second
    runs: list[SystemRun]
    seconds: float = 0.0
