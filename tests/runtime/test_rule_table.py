"""runtime/README.md's table "Rules the model enforces" stays true: every row names, for its rule,
where the model checks it (`file:function`, the function found in that file) and the tests that
provoke it (pytest node ids, each collected by pytest), or says "none yet"; and every rule the model
enforces has its row (a row dropped or renamed is seen). The checker itself is shown to refuse a
made-up function, file and node id."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "runtime" / "README.md"
HEADER = "| rule | source of the fact | where the model checks it | test |"

# the rules the model enforces (issue 15's list): each must begin a row's rule cell
REQUIRED = ["UB capacity", "UB bounds", "`DataCopy` length", "UB side of a DMA", "`blockCount > 1`",
            "GM bounds", "`aclshmem_ptr`:", "`aclshmem_ptr`, SDMA: `pe`", "kernel type", "`SyncAll` only",
            "`SyncAll` that a core", "queues", "`DeQue` of an empty queue", "`TBuf::GetWithOffset`",
            "`WaitFlag` needs", "event flags are binary", "event ids", "UB->GM under `SetAtomic",
            "DMA atomics only", "SDMA scratch", "SDMA overlap", "SDMA completion", "SDMA queue depth", "SQE cost", "waits",
            "dead peers", "core count", "SHMEM default UB", "signal alignment", "stale read",
            "one scalar writer per line", "lost write", "dirty at return", "A2/A3 arithmetic types",
            "A2/A3 `Div` types", "A2/A3 `Duplicate` types", "`Cast` pairs", "`Cast` modes", "widening overlap"]

WHERE = re.compile(r"`([^`:\s]+):([A-Za-z_]\w*)`")
NODE = re.compile(r"`(tests/[^`\s]+?\.py::[^`\s]+)`")


def rows(text: str) -> list[list[str]]:
    """The table's rows, each [rule, source, where, test]."""
    lines = text.splitlines()
    start = lines.index(HEADER)
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of the rule table has {len(cells)} cells, not 4: {line[:120]}"
        out.append(cells)
    return out


def problems(table: list[list[str]], collected: set[str], root: Path = ROOT) -> list[str]:
    """What in the table is not true of the source and the suite."""
    bad = []
    for rule, source, where, test in table:
        name = rule[:50]
        if not source:
            bad.append(f"{name}: no source")
        refs = WHERE.findall(where)
        if not refs:
            bad.append(f"{name}: no `file:function` in its where cell")
        for path, func in refs:
            f = root / path
            if not f.is_file():
                bad.append(f"{name}: {path} does not exist")
            elif not re.search(rf"\b{re.escape(func)}\b", f.read_text()):
                bad.append(f"{name}: {func} does not occur in {path}")
        nodes = NODE.findall(test)
        if not nodes and not test.startswith("none yet"):
            bad.append(f"{name}: neither a test node id nor 'none yet'")
        bad += [f"{name}: {n} is not collected by pytest" for n in nodes if n not in collected]
    return bad


def collect(files: set[str]) -> set[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *sorted(files)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    return {line.strip() for line in p.stdout.splitlines() if "::" in line}


TABLE = rows(README.read_text())


def test_every_rule_has_its_row():
    rules = [r[0] for r in TABLE]
    missing = [req for req in REQUIRED if not any(r.startswith(req) for r in rules)]
    assert missing == [], f"runtime/README.md's rule table lacks rows for: {missing}"


def test_every_where_and_test_of_the_table_is_real():
    files = {n.split("::")[0] for r in TABLE for n in NODE.findall(r[3])}
    assert files, "no test node ids found in the rule table"
    assert problems(TABLE, collect(files)) == []


def test_rules_without_a_test_are_the_known_ones():
    """A row may not say "none yet" silently: these are the rules still without a test."""
    untested = sorted(req for req in REQUIRED for r in TABLE if r[0].startswith(req) and r[3].startswith("none yet"))
    assert untested == sorted(["UB side of a DMA", "`aclshmem_ptr`, SDMA: `pe`", "kernel type",
                               "UB->GM under `SetAtomic", "DMA atomics only"])


def test_the_checker_refuses_what_is_not_there(tmp_path):
    (tmp_path / "m.cpp").write_text("void RealCheck() {}\n")
    table = [["r1", "src", "`m.cpp:RealCheck`", "`tests/x.py::test_a[1]`"],
             ["r2", "src", "`m.cpp:NoSuchCheck`", "`tests/x.py::test_gone`"],
             ["r3", "src", "`gone.cpp:RealCheck`", "none yet"],
             ["r4", "", "m.cpp RealCheck", "test_a"]]
    got = problems(table, {"tests/x.py::test_a[1]"}, tmp_path)
    assert got == ["r2: NoSuchCheck does not occur in m.cpp",
                   "r2: tests/x.py::test_gone is not collected by pytest",
                   "r3: gone.cpp does not exist",
                   "r4: no source",
                   "r4: no `file:function` in its where cell",
                   "r4: neither a test node id nor 'none yet'"]
