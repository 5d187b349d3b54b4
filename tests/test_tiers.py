"""The fast tier's list (tests/tiers.py) names real tests: every entry matches a collected test, so
a renamed test cannot silently come back into (or stay out of) the fast tier, and the matcher
treats "*" as a prefix and everything else as an exact node id."""

import subprocess
import sys
from pathlib import Path

import tiers

ROOT = Path(__file__).resolve().parents[1]


def test_every_entry_matches_a_collected_test():
    files = sorted({p.split("::")[0] for p in tiers.SLOW})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *files], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    collected = [line.strip() for line in proc.stdout.splitlines() if "::" in line]
    unmatched = [p for p in tiers.SLOW
                 if not any(c == p or (p.endswith("*") and c.startswith(p[:-1])) for c in collected)]
    assert collected and not unmatched, f"tests/tiers.py lists what is not collected: {unmatched}"


def test_the_matcher_is_exact_or_a_prefix():
    assert tiers.slow_in_fast_tier("tests/e2e/test_run.py::test_every_example_runs_correctly[3]")
    assert not tiers.slow_in_fast_tier("tests/e2e/test_run.py::test_every_example_runs_correctly[2]")
    assert tiers.slow_in_fast_tier("tests/e2e/test_translation.py::test_every_accepted_schedule_runs_as_its_proof[2-None]")
    assert not tiers.slow_in_fast_tier("tests/e2e/test_run.py::test_every_example_runs_correctly[33]")
