import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# helpers shared by tests in several folders (routing_meta.py) import by name
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
