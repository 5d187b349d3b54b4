"""Fixtures of the simulate tests (the tiny machine, the shipped CloudMatrix384); the helpers live
in simkit.py."""

import sys
from pathlib import Path

import pytest

from stratac.tools.simulate.machine import Machine, load_machine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simkit import ROOT, TINY  # noqa: E402


@pytest.fixture
def tiny(tmp_path) -> Machine:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return load_machine(path)


@pytest.fixture(scope="module")
def cm384() -> Machine:
    return load_machine(ROOT / "machines" / "cloudmatrix384.toml")
