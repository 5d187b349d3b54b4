"""Fixtures of the fault tests; the helpers live in faultkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faultkit import Ranks  # noqa: E402


@pytest.fixture
def ranks(tmp_path):
    """Starts scenarios; whatever a test leaves running is killed and reaped at the end."""
    started: list[Ranks] = []

    def start(scenario: str, world: int, timeout: float, arg: str = "") -> Ranks:
        d = tmp_path / f"job{len(started)}"
        d.mkdir()
        job = Ranks(scenario, world, d, timeout, arg)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()
