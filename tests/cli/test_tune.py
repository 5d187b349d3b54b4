"""`stratac tune` and the selecting entry points through the real CLI (stratac.cli.main): the
table it writes (provenance, rows, crossovers) against the times it reports and, predicted, against
`stratac simulate`'s own predictions; `run --selected` and `bench --selected` following a table
written here by hand (so the expected pick is known independently of any measurement); bad tables
and files refused in one message."""

from __future__ import annotations

import json
from pathlib import Path

from stratac import cli
from stratac.tools.bench import sweep
from stratac.tools.simulate.driver import simulate_file
from stratac.tools.simulate.machine import load_machine

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
MACHINE = ROOT / "machines" / "cloudmatrix384.toml"


def _allreduce_file(tmp_path) -> Path:
    f = tmp_path / "ar.strata"
    f.write_text((EX / "allreduce_twoshot.strata").read_text() + "\n" + (EX / "allreduce_oneshot.strata").read_text())
    return f


def _check_entry(e: dict) -> None:
    """Rows and crossovers are what the entry's own times say: per size, the order is by time."""
    sizes, times = e["sizes"], e["time_us"]
    for i, s in enumerate(sizes):
        row = next(r for r in e["rows"] if r["upto"] is None or s <= r["upto"])
        assert row["order"] == sorted(times, key=lambda n: (times[n][i], n)), (s, row, times)
    best = [min(times, key=lambda n: (times[n][i], n)) for i in range(len(sizes))]
    want = [[sizes[i], sizes[i + 1], best[i], best[i + 1]] for i in range(len(sizes) - 1) if best[i] != best[i + 1]]
    assert [[*c["between"], c["from"], c["to"]] for c in e["crossovers"]] == want


def test_tune_measures_and_writes_the_table(tmp_path, capsys, monkeypatch):
    f, out = _allreduce_file(tmp_path), tmp_path / "sel.json"
    sweeps, real = [], sweep.run

    def recorded(spec, echo):      # the real sweep, its sizes and calls noted
        sweeps.append((spec.sizes, spec.iters, spec.warmup))
        return real(spec, echo=echo)

    monkeypatch.setattr(sweep, "run", recorded)
    rc = cli.main(["tune", str(f), "--world", "2", "--sizes", "4K,1M", "--dtype", "f32", "--iters", "3",
                   "--warmup", "1", "--timeout", "60", "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    # sizes up to 256K are timed over 10x the calls (and warm-up calls), in a sweep of their own
    assert sweeps == [([4096], 30, 10), ([1 << 20], 3, 1)]
    table = json.loads(out.read_text())
    assert table["stratac_selection"] == 1
    e, = table["entries"]
    assert (e["kind"], e["world"], e["dtype"], e["sizes"]) == ("allreduce", 2, "f32", [4096, 1 << 20])
    assert e["method"].startswith("measured on the CPU build")
    prov = table["provenance"]
    assert prov["command"] == (f"stratac tune {f} --world 2 --sizes 4K,1M --dtype f32 --iters 3 --warmup 1 "
                               f"--timeout 60 --out {out}")
    assert prov["world"] == 2 and "CPUs" in prov["machine"] and prov["date"][:2] == "20"
    assert set(e["time_us"]) == {"allreduce_twoshot", "allreduce_oneshot"}
    _check_entry(e)
    assert f"# wrote {out}" in printed.out and "# allreduce, world 2, f32" in printed.out
    # a second world is merged into the same table, the first kept
    rc = cli.main(["tune", str(f), "--world", "3", "--sizes", "4K", "--iters", "2", "--warmup", "0",
                   "--out", str(out)])
    assert rc == 0
    assert sorted(x["world"] for x in json.loads(out.read_text())["entries"]) == [2, 3]


def test_tune_predicts_with_a_machine(tmp_path, capsys):
    f, out = _allreduce_file(tmp_path), tmp_path / "pred.json"
    rc = cli.main(["tune", str(f), "--world", "8", "--sizes", "4K,1M,64M", "--machine", str(MACHINE),
                   "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    e, = json.loads(out.read_text())["entries"]
    assert e["method"] == f"predicted by stratac simulate --machine {MACHINE}"
    res = simulate_file(str(f), load_machine(str(MACHINE)), 8, [4096, 1 << 20, 64 << 20], "f32")
    for p in res.predictions:
        assert abs(e["time_us"][p.schedule][e["sizes"].index(p.size)] - p.time_us) < 0.01
    _check_entry(e)
    for c in e["crossovers"]:
        assert "crossover between" in printed.out and c["to"] in printed.out


def _hand_table(path: Path) -> None:
    """Two-shot first up to 8 KiB, one-shot above: the opposite of the default rule's small pick
    (one-shot has fewer statements), so following it is visible."""
    path.write_text(json.dumps({"stratac_selection": 1, "provenance": {"note": "written by a test"},
                                "entries": [{"kind": "allreduce", "world": 2, "dtype": "f32", "rows": [
                                    {"upto": 8192, "order": ["allreduce_twoshot", "allreduce_oneshot"]},
                                    {"upto": None, "order": ["allreduce_oneshot", "allreduce_twoshot"]}]}]}))


def test_run_selected_follows_the_selection_table(tmp_path, capsys):
    f, table = _allreduce_file(tmp_path), tmp_path / "hand.json"
    _hand_table(table)
    for size, want in (("4K", "allreduce_twoshot"), ("16K", "allreduce_oneshot")):
        rc = cli.main(["run", str(f), "--world", "2", "--size", size, "--iters", "2", "--selected",
                       "--selection", str(table)])
        out = capsys.readouterr().out
        assert rc == 0, out
        row = next(line.split() for line in out.splitlines() if line.startswith("select:allreduce "))
        assert row[-1] == "OK", out
        assert f"select:allreduce at {size[:-1]}.0KiB: picked {want}" in out, out


def test_bench_selected_follows_the_selection_table(tmp_path, capsys):
    f, table, js = _allreduce_file(tmp_path), tmp_path / "hand.json", tmp_path / "b.json"
    _hand_table(table)
    rc = cli.main(["bench", str(f), "--world", "2", "--sizes", "4K,32K", "--iters", "2", "--warmup", "0",
                   "--selected", "--selection", str(table), "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0, out
    recs = [r for r in json.loads(js.read_text())["results"] if r["system"] == "stratac"]
    assert {(r["schedule"], r["size"], r["picked"], r["errors"]) for r in recs} == {
        ("select:allreduce", 4096, "allreduce_twoshot", 0), ("select:allreduce", 32768, "allreduce_oneshot", 0)}
    assert "#   picked: 4KiB allreduce_twoshot, 32KiB allreduce_oneshot" in out, out


def test_a_bad_table_and_a_file_without_collectives_are_one_message(tmp_path, capsys):
    f, bad = _allreduce_file(tmp_path), tmp_path / "bad.json"
    bad.write_text('{"entries": []}')
    rc = cli.main(["run", str(f), "--world", "2", "--size", "4K", "--iters", "1", "--selected",
                   "--selection", str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and "is not a stratac selection table (version 1, as `stratac tune` writes)" in err, err
    rc = cli.main(["tune", str(EX / "moe_decode.strata"), "--world", "2", "--out", str(tmp_path / "t.json"),
                   "--machine", str(MACHINE)])
    err = capsys.readouterr().err
    assert rc == 2 and "stratac tune: error:" in err and "no collective schedule to rank" in err, err
    assert not (tmp_path / "t.json").exists()
