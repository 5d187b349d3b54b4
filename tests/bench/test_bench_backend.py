"""`stratac bench --vs backend`: the collectives through torch.distributed over backend "stratac",
zero-copy and staged, beside the direct call of the entry point the backend runs and beside gloo,
from one real bench job at world 2 (an AllReduce and an AllGather, two small sizes). The table's
rows, the checks of every row, and the overhead column against the two times it is the difference
of. Never timing: nothing here asserts on a speed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from stratac.tools.bench import backendpeer, report

ROOT = Path(__file__).resolve().parents[2]
SIZES = (4096, 8192)
KINDS = {"allreduce": "dist.all_reduce", "allgather": "dist.all_gather_into_tensor"}
GLOO_NAMES = {"allreduce": "all_reduce",   # benchpeer.gloo_task: the name torch has
              "allgather": ("all_gather_single" if hasattr(dist, "all_gather_single")
                            else "all_gather_into_tensor")}


def _bench(args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "stratac", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def backend_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-backend")
    src = tmp / "ar_ag.strata"
    src.write_text((ROOT / "examples" / "allreduce_twoshot.strata").read_text() + "\n"
                   + (ROOT / "examples" / "allgather_push.strata").read_text())
    out_json = tmp / "out.json"
    p = _bench([str(src), "--world", "2", "--sizes", ",".join(map(str, SIZES)), "--vs", "gloo,backend",
                "--iters", "2", "--warmup", "1", "--json", str(out_json), "--no-progress"])
    assert p.returncode == 0, p.stdout + p.stderr
    return {"stdout": p.stdout, "json": json.loads(out_json.read_text())}


def _backend_rows(stdout: str, kind: str) -> list[list[str]]:
    """The rows of one kind's table in the backend section, split on whitespace."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# torch.distributed backend"))
    head = next(i for i in range(start, len(lines)) if lines[i].startswith(f"# {kind}, world 2"))
    assert lines[head + 1].lstrip("#").split() == ["size", "row", "call", "picked", "time(us)", "#wrong",
                                                   "staged(B)", "overhead(us)", "x", "direct"]
    rows = []
    for line in lines[head + 2:]:
        if line.startswith("#"):
            break
        rows.append(line.split())
    return rows


def test_every_kind_and_size_has_direct_zero_copy_staged_and_gloo_rows(backend_run):
    out = backend_run["stdout"]
    assert "# peers: gloo, backend" in out
    for kind, call in KINDS.items():
        rows = _backend_rows(out, kind)
        got = [(int(r[0]), r[1], r[2]) for r in rows]
        want = [(s, v, name) for s in SIZES for v, name in
                (("direct", f"select:{kind}"), ("zero-copy", call), ("staged", call),
                 ("gloo", GLOO_NAMES[kind]))]
        assert got == want
        for r in rows:
            assert r[5] == "0"                          # checked against the reference: no rank differed
            if r[1] != "gloo":
                assert r[3].startswith(kind)            # the library schedule the entry point picked
    # the schedules' own table still has gloo's columns, and no column for the backend
    head = next(line for line in out.splitlines() if line.startswith("#       size       count"))
    assert len(head.split("|")) == 3


def test_overhead_is_the_difference_of_the_printed_times(backend_run):
    out = backend_run["stdout"]
    for kind in KINDS:
        rows = _backend_rows(out, kind)
        for size in SIZES:
            at = {r[1]: r for r in rows if int(r[0]) == size}
            direct = float(at["direct"][4])
            assert at["direct"][7] == "-" and at["direct"][8] == "-"
            for v in ("zero-copy", "staged", "gloo"):
                t, over = float(at[v][4]), float(at[v][7])
                # each printed to 0.1 us: the printed difference is within two roundings of it
                assert abs(over - (t - direct)) <= 0.1 + 1e-9, (kind, size, v, at[v])
                assert at[v][8].endswith("x")


def test_json_rows_are_checked_and_their_overhead_is_against_the_same_run(backend_run):
    res = backend_run["json"]["results"]
    assert backend_run["json"]["meta"]["peers"] == ["gloo", "backend"]
    back = [r for r in res if r["system"] == "backend"]
    assert {(r["kind"], r["size"], r["variant"]) for r in back} == \
        {(k, s, v) for k in KINDS for s in SIZES for v in backendpeer.VARIANTS}
    direct = {(r["kind"], r["size"]): r for r in back if r["variant"] == "direct"}
    for r in back + [r for r in res if r["system"] == "gloo"]:
        assert r["errors"] == 0 and r["time_us"] > 0 and r["world"] == 2
        if r.get("variant") == "direct":
            continue
        d = direct[(r["kind"], r["size"])]
        assert r["overhead_us"] == pytest.approx(r["time_us"] - d["time_us"])
        assert r["x_direct"] == pytest.approx(r["time_us"] / d["time_us"])
    for r in back:
        if r["variant"] == "direct":       # no dist call, nothing staged
            assert r["staged_bytes"] == 0
        elif r["variant"] == "staged":     # the input copied in, the result copied out
            out_bytes = r["size"]
            in_bytes = r["size"] if r["kind"] == "allreduce" else r["size"] // 2
            assert r["staged_bytes"] == in_bytes + out_bytes
        elif r["kind"] == "allreduce":     # on the heap already: no copy at all
            assert r["staged_bytes"] == 0 and r["zero_copy"]


def test_a_wrong_backend_result_is_counted_and_fails_the_run(tmp_path):
    """The check of a backend row is real: one rank's staged result changed after the call is
    counted in #wrong and the bench exits 1, its direct and zero-copy rows still right."""
    env = dict(os.environ, STRATAC_TEST_CORRUPT="1:backend-staged:3")
    p = _bench([str(ROOT / "examples" / "allreduce_twoshot.strata"), "--world", "2", "--sizes", "4096",
                "--vs", "backend", "--iters", "1", "--warmup", "0", "--no-progress"], env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    rows = {r[1]: r for r in _backend_rows(p.stdout, "allreduce")}
    assert rows["staged"][5] == "1" and rows["direct"][5] == "0" and rows["zero-copy"][5] == "0"
    assert "changed backend-staged[3]" in p.stdout + p.stderr


def test_backend_table_formats_a_missing_time_as_n_a():
    """A variant no kernel took (a note, no time) prints n/a, not a number."""
    rec = {"system": "backend", "kind": "allreduce", "size": 4096, "variant": "zero-copy",
           "schedule": "dist.all_reduce", "picked": None, "time_us": None, "errors": None,
           "staged_bytes": None, "overhead_us": None, "x_direct": None, "op": "sum", "root": None,
           "note": "stratac backend: refused"}
    res = report.BenchResult({"world": 2, "dtype": "f32"}, [rec], [], 0)
    lines = report.backend_table(res)
    row = next(line for line in lines if not line.startswith("#"))
    assert row.split()[-4:] == ["-", "-", "n/a", "n/a"] and "# backend: stratac backend: refused" in lines


def test_backend_with_selected_is_refused():
    p = _bench([str(ROOT / "examples" / "allreduce_twoshot.strata"), "--world", "2", "--sizes", "4096",
                "--vs", "backend", "--selected", "--no-progress"], timeout=120)
    assert p.returncode == 2 and "--vs backend" in p.stderr and "--selected" in p.stderr, p.stderr
