"""The schedules of call_schedules.py are shared by the rank scenarios (ranks.py, run as a script)
and the tests here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
