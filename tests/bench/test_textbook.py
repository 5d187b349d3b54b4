"""The tables of docs/bench.md "Textbook algorithms against the direct schedules"
(stratac/tools/bench/textbook.py): from a real `stratac simulate` run at a tiny size, and from a
hand-written bench JSON whose ratios are known."""

import json
from pathlib import Path

from stratac.tools.bench.textbook import bench_tables, main, sim_tables
from stratac.tools.simulate.driver import simulate_file
from stratac.tools.simulate.machine import load_machine
from stratac.tools.simulate.report import write_json

ROOT = Path(__file__).resolve().parents[2]


def _row(lines, world, name):
    [row] = [x for x in lines if x.startswith(f"| {world} | {name} |")]
    return [c.strip() for c in row.strip("|").split("|")]


def test_sim_tables_give_each_schedule_its_ratio_to_the_direct_one(tmp_path, capsys):
    src = tmp_path / "ar.strata"
    src.write_text("\n".join((ROOT / "examples" / f"allreduce_{n}.strata").read_text()
                             for n in ("twoshot", "oneshot", "ring", "halving_doubling")))
    m = load_machine(ROOT / "machines" / "cloudmatrix384.toml")
    paths = []
    for world in (3, 4):
        res = simulate_file(str(src), m, world, [4096, 1 << 20])
        paths.append(str(tmp_path / f"w{world}.json"))
        write_json(res, paths[-1])
    # a schedule the run skipped, as a `requires` makes simulate skip one: world 3's halving-doubling
    # results replaced by the record (tests/simulate/test_command.py checks the record itself)
    data = json.loads(Path(paths[0]).read_text())
    data["results"] = [r for r in data["results"] if r["schedule"] != "allreduce_halving_doubling"]
    data["skipped"] = [{"schedule": "allreduce_halving_doubling",
                        "why": "does not support world 3: it requires world is pow2, f.strata:9"}]
    Path(paths[0]).write_text(json.dumps(data))
    lines = sim_tables(paths)
    assert lines[0] == "#### allreduce: predicted us per call (x allreduce_twoshot, bound)"
    assert lines[2] == "| world | schedule | 4KiB | 1MiB |"
    got = {(p.world, p.schedule, p.size): p for w in (3, 4) for p in
           simulate_file(str(src), m, w, [4096, 1 << 20]).predictions}
    for world in (3, 4):
        cells = _row(lines, world, "allreduce_ring")
        for cell, size in zip(cells[2:], (4096, 1 << 20)):
            ring, two = got[(world, "allreduce_ring", size)], got[(world, "allreduce_twoshot", size)]
            assert cell == f"{ring.time_us:,.1f} ({two.time_us / ring.time_us:.2f}x, {ring.bound})"
        two = got[(world, "allreduce_twoshot", 4096)]
        assert _row(lines, world, "allreduce_twoshot")[2] == f"{two.time_us:,.1f} (1.00x, {two.bound})"
    hd, two = got[(4, "allreduce_halving_doubling", 4096)], got[(4, "allreduce_twoshot", 4096)]
    assert _row(lines, 4, "allreduce_halving_doubling")[2] == \
        f"{hd.time_us:,.1f} ({two.time_us / hd.time_us:.2f}x, {hd.bound})"
    assert _row(lines, 3, "allreduce_halving_doubling")[2] == \
        "skipped: does not support world 3: it requires world is pow2"
    assert _row(lines, 4, "allreduce_hierarchical")[2] == "not in this run"   # the slot kept for it
    assert main(["sim", *paths]) == 0
    assert capsys.readouterr().out.splitlines()[:len(lines)] == lines


def test_a_file_that_is_not_a_run_is_named(tmp_path, capsys):
    (tmp_path / "meta_only.json").write_text('{"meta": {}}')
    (tmp_path / "broken.json").write_text("{")
    for name, why in (("meta_only.json", "it needs meta.world and results"), ("missing.json", "No such file"),
                      ("broken.json", "Expecting property name")):
        assert main(["sim", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"textbook: {tmp_path / name}: ") and why in err, err


def test_bench_tables_ratio_is_the_direct_time_of_the_same_run(tmp_path):
    rec = lambda name, size, t, err=0: {"system": "stratac", "schedule": name, "kind": "broadcast",
                                        "world": 4, "size": size, "time_us": t, "errors": err}
    data = {"meta": {"world": 4, "loadavg_before": 3.0, "loadavg_after": 5.25},
            "results": [rec("broadcast", 65536, 200.0), rec("broadcast_tree", 65536, 400.0),
                        rec("broadcast", 1 << 20, 300.0), rec("broadcast_tree", 1 << 20, 150.0, 1),
                        {"system": "gloo", "schedule": "broadcast", "kind": "broadcast", "world": 4,
                         "size": 65536, "time_us": 1.0, "errors": 0}]}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(data))
    lines = bench_tables([str(p)])
    assert lines[0] == ("#### broadcast, world 4: measured us per call (x broadcast, same run); "
                        "load average 3.0 before, 5.2 after")
    assert lines[2] == "| schedule | 64KiB | 1MiB | #wrong |"
    assert lines[4] == "| broadcast | 200.0 (1.00x) | 300.0 (1.00x) | 0 |"
    assert lines[5] == "| broadcast_tree | 400.0 (0.50x) | 150.0 (2.00x) | 1 |"
