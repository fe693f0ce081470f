"""Chaos suite fixtures: the session's report, sizes and seed (see ``scale`` and ``report``)."""

from __future__ import annotations

import random

import pytest

from tests.chaos.report import ChaosReport, report_path
from tests.chaos.scale import Sizes, scale, seed, sizes


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    value = seed()
    print(f"\nchaos seed: {value} (RETRYD_CHAOS_SEED={value} repeats this run's choices)")
    return value


@pytest.fixture(scope="session")
def chaos_report(tmp_path_factory: pytest.TempPathFactory, chaos_seed: int) -> ChaosReport:
    path = report_path(tmp_path_factory.getbasetemp())
    print(f"\nchaos report: {path}")
    return ChaosReport(path, scale(), chaos_seed)


@pytest.fixture(scope="session")
def chaos_sizes() -> Sizes:
    return sizes()


@pytest.fixture
def chaos_rng(request: pytest.FixtureRequest, chaos_seed: int) -> random.Random:
    """A random source per scenario, independent of which scenarios run and in what order."""
    return random.Random(f"{chaos_seed}:{request.node.name}")
