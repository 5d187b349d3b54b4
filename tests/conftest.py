import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# helpers shared by tests in several folders (routing_meta.py) import by name
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def pytest_collection_modifyitems(config, items):
    """The tests tests/tiers.py lists leave the fast tier (`-m "not slow"`); CI runs them all."""
    from tiers import slow_in_fast_tier
    for item in items:
        if slow_in_fast_tier(item.nodeid):
            item.add_marker(pytest.mark.slow)
