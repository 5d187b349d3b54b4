"""`stratac simulate` through add_parser on a fresh parser: the table and JSON of collectives and
MoE, and every bad request or machine file as one error line."""

import argparse
import json

import numpy as np
import pytest
from simkit import REQUIRES, ROOT, TINY

from stratac.tools.simulate.command import add_parser
from stratac.tools.simulate.stage_cost import CATEGORIES, SCALAR_ELEMENT_US


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="stratac")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    status = args.fn(args)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_table_and_json(tmp_path, capsys):
    src = tmp_path / "ar.strata"
    src.write_text((ROOT / "examples" / "allreduce_twoshot.strata").read_text() + "\n"
                   + (ROOT / "examples" / "allreduce_staging_baseline.strata").read_text())
    out_json = tmp_path / "out.json"
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    status, out, err = _run(["simulate", str(src), "--machine", machine, "--world", "16",
                             "--sizes", "4,1K,64M", "--json", str(out_json)], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"# stratac simulate {src}  world 16  dtype f32  cores 48  machine {machine}")
    assert "MODEL PREDICTIONS" in lines[1] and "NOT MEASUREMENTS" in lines[1]
    assert "# allreduce_twoshot: allreduce, world 16  (ratio against allreduce_twoshot)" in lines
    assert "# allreduce_staging_baseline: allreduce, world 16  (ratio against allreduce_twoshot)" in lines
    head = [x for x in lines if x.startswith("#       size")]
    assert len(head) == 2 and head[0].split()[1:] == ["size", "count", "type", "time(us)", "algbw",
                                                      "busbw", "bound", "ratio"]
    rows = [x.split() for x in lines if x and not x.startswith("#")]
    assert len(rows) == 6                              # 4 B and 1K are distinct counts (1 and 256)
    assert [r[0] for r in rows[:3]] == ["4", "1024", "67108864"]
    assert all(r[-1] == "1.00x" for r in rows[:3])
    assert all(float(r[-1].rstrip("x")) < 1 for r in rows[4:])
    assert lines[-1] == f"# wrote {out_json}"
    data = json.loads(out_json.read_text())
    assert data["meta"]["what"] == "model predictions, not measurements"
    assert data["meta"]["figures"]["rank"]["vector_cores"] == 48
    rec = data["results"][-1]
    assert set(rec) == {"schedule", "kind", "world", "size", "count", "dtype", "time_us", "algbw",
                        "busbw", "bound", "breakdown_us", "ratio", "ratio_to"}
    assert rec["ratio_to"] == "allreduce_twoshot" and rec["ratio"] < 1
    assert rec["busbw"] == pytest.approx(rec["algbw"] * 2 * 15 / 16)
    assert sum(rec["breakdown_us"].values()) == pytest.approx(rec["time_us"])


def test_single_schedule_has_no_ratio_column(capsys):
    status, out, _ = _run(["simulate", str(ROOT / "examples" / "alltoall.strata"), "--machine",
                           str(ROOT / "machines" / "cloudmatrix384.toml"), "--world", "4",
                           "--sizes", "1M"], capsys)
    assert status == 0
    assert [x for x in out.splitlines() if x.startswith("#       size")][0].split()[-1] == "bound"


def test_moe_table_and_json(tmp_path, capsys):
    src = tmp_path / "moe.strata"
    src.write_text((ROOT / "examples" / "moe_prefill.strata").read_text() + "\n"
                   + (ROOT / "examples" / "moe_staging_baseline.strata").read_text())
    out_json = tmp_path / "moe.json"
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    status, out, err = _run(["simulate", str(src), "--machine", machine, "--world", "4",
                             "--tokens", "16,64", "--hidden", "256", "--json", str(out_json)], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"# stratac simulate {src}  world 4  dtype bf16  cores 48")
    assert "MODEL PREDICTIONS" in lines[1] and "NOT MEASUREMENTS" in lines[1]
    assert lines[2].startswith("# MoE: hidden 256, topk 8, experts 32 (8 per rank); routing uniform")
    assert any("ASSUMED" in x and "scalar" in x for x in lines[:6])
    assert "# moe_staging_baseline_dispatch: moe_dispatch, world 4  (ratio against moe_prefill_dispatch)" \
        in lines
    head = [x for x in lines if x.startswith("#   tokens")]
    assert len(head) == 4 and head[0].split()[1:] == ["tokens", "received", "rows/rank", "type",
                                                      "time(us)", "GB/s", "bound", "heap/rank", "ratio"]
    rows = [x.split() for x in lines if x and not x.startswith("#")]
    assert len(rows) == 8 and [r[0] for r in rows[:2]] == ["16", "64"]
    assert all(r[3] == "bf16" for r in rows)
    assert float(rows[1][2]) == pytest.approx(64 * 8)                       # rows received per rank
    assert int(rows[1][1]) == 64 * 8 * 256 * 2                             # bytes received per rank
    staged = rows[4:6]                                                     # staging dispatch
    assert all(float(r[-1].rstrip("x")) < 1 for r in staged)
    data = json.loads(out_json.read_text())
    assert data["meta"]["moe"]["experts"] == 32 and data["meta"]["moe"]["routing"] == "uniform"
    assert data["meta"]["moe"]["assumptions"]["scalar_element_us"] == SCALAR_ELEMENT_US
    rec = data["results"][0]
    assert rec["moe"]["tokens"] == 16 and rec["count"] == 16 and rec["busbw"] == rec["algbw"]
    assert sum(rec["breakdown_us"].values()) == pytest.approx(rec["time_us"])
    assert set(rec["breakdown_us"]) == set(CATEGORIES)


def test_alltoallv_takes_one_destination_per_row(capsys):
    status, out, err = _run(["simulate", str(ROOT / "examples" / "alltoallv.strata"), "--machine",
                             str(ROOT / "machines" / "cloudmatrix384.toml"), "--world", "4",
                             "--tokens", "32", "--hidden", "128", "--topk", "3"], capsys)
    assert status == 0, err
    assert "# AllToAllV: rows of 128 elements, one destination rank each" in out
    row = [x.split() for x in out.splitlines() if x and not x.startswith("#")]
    assert row[0][:3] == ["32", str(32 * 128 * 2), "32.0"]      # topk does not apply: one row each


@pytest.mark.parametrize("file, extra, message", [
    ("moe_prefill", ["--experts", "6"], "--experts 6 is not a positive multiple of the world size (4)"),
    ("moe_prefill", ["--topk", "40", "--experts", "32"], "--topk 40 must be at most the number of experts"),
    ("moe_prefill", ["--dtype", "i32"], "moves float tokens"),
    ("moe_prefill", ["--dtype", "i8"], "moe_prefill_dispatch moves float tokens: --dtype f32, f16 or bf16"),
    ("moe_prefill", ["--sizes", "1M"], "--sizes applies to collectives"),
    ("broadcast", ["--tokens", "16"], "apply to MoE and AllToAllV schedules"),
])
def test_bad_moe_requests_are_one_message(capsys, file, extra, message):
    status, out, err = _run(["simulate", str(ROOT / "examples" / f"{file}.strata"), "--machine",
                             str(ROOT / "machines" / "cloudmatrix384.toml"), "--world", "4",
                             "--tokens", "16", *extra], capsys)
    assert status == 1 and out == ""
    assert err.startswith("stratac simulate: error: ") and message in err


@pytest.mark.parametrize("extra, message", [
    (["--world", "769"], "world 769 is larger than the machine"),
    (["--world", "4", "--cores", "49"], "--cores must be between 1 and 48"),
    (["--world", "4", "--dtype", "i8"], "broadcast is not built for i8: int8 is a payload to move"),
])
def test_bad_requests_are_one_message(capsys, extra, message):
    status, out, err = _run(["simulate", str(ROOT / "examples" / "broadcast.strata"), "--machine",
                             str(ROOT / "machines" / "cloudmatrix384.toml"), *extra], capsys)
    assert status == 1 and out == ""
    assert err.startswith("stratac simulate: error: ") and message in err
    assert "Traceback" not in err


def test_a_barrier_only_some_ranks_pass_joins_its_members_alone(capsys):
    """good_leader_barriers.strata: the lane barriers inside `if node.rank == 0` are passed by the
    node leaders alone; the model joins a barrier's members at its place, so the others wait at the
    node barrier after the if, and the call is predicted (a world join of every barrier would wait
    for members that never come)."""
    status, out, err = _run(["simulate", str(ROOT / "tests" / "verify" / "corpus" / "good_leader_barriers.strata"),
                             "--machine", str(ROOT / "machines" / "cloudmatrix384.toml"), "--world", "4",
                             "--sizes", "1M"], capsys)
    assert status == 0 and err == "", err
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("1048576"))
    assert float(row[4]) > 0


def test_bad_machine_file_through_the_command(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("vector_cores = 1\n", ""))
    status, out, err = _run(["simulate", str(ROOT / "examples" / "broadcast.strata"), "--machine",
                             str(bad), "--world", "2"], capsys)
    assert status == 1 and out == ""
    assert err == f"stratac simulate: error: {bad}: missing key 'vector_cores' in [rank] (an integer >= 1)\n"


def test_a_schedule_that_excludes_the_world_is_skipped_next_to_the_others(tmp_path, capsys):
    # the textbook halving-doubling takes power-of-two worlds only: at world 12 the ring is still
    # predicted
    src = tmp_path / "ar.strata"
    src.write_text((ROOT / "examples" / "allreduce_ring.strata").read_text() + "\n"
                   + REQUIRES.read_text())
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    out_json = tmp_path / "out.json"
    status, out, err = _run(["simulate", str(src), "--machine", machine, "--world", "12",
                             "--sizes", "1M", "--json", str(out_json)], capsys)
    assert status == 0, err
    assert "# allreduce_ring: allreduce, world 12" in out
    assert "# halving_doubling_pow2: skipped: does not support world 12: it requires world is pow2" in out
    data = json.loads(out_json.read_text())
    assert [r["schedule"] for r in data["results"]] == ["allreduce_ring"]
    [skip] = data["skipped"]
    assert skip["schedule"] == "halving_doubling_pow2"
    ring_lines = len((ROOT / "examples" / "allreduce_ring.strata").read_text().splitlines())
    line = ring_lines + 1 + next(i for i, text in enumerate(REQUIRES.read_text().splitlines(), 1)
                                 if text.strip().startswith("requires"))
    assert skip["why"] == f"does not support world 12: it requires world is pow2, {src}:{line}"
    # alone, it is an error naming the constraint
    status, out, err = _run(["simulate", str(REQUIRES),
                             "--machine", machine, "--world", "12", "--sizes", "1M"], capsys)
    assert status == 1
    assert "halving_doubling_pow2 does not support world 12: it requires world is pow2" in err


def test_max_recv_sizes_the_bounded_window(tmp_path, capsys):
    """--max-recv R: a bounded window of R rows per rank. The heap per rank grows by exactly
    hidden x 2 bytes (bf16) per row of R, is the unbounded default's at R = world x tokens x topk,
    and shows in the header and the JSON; a sample routing past R, and R for a schedule whose
    window has no bound, are one error line each."""
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    bounded = str(ROOT / "examples" / "moe_prefill_bounded.strata")
    W, T, H, K = 4, 64, 256, 4

    def heaps(extra):
        out_json = tmp_path / "m.json"
        status, out, err = _run(["simulate", bounded, "--machine", machine, "--world", str(W), "--tokens",
                                 str(T), "--hidden", str(H), "--topk", str(K), *extra, "--json",
                                 str(out_json)], capsys)
        assert status == 0, err
        data = json.loads(out_json.read_text())
        return out, data["meta"]["moe"], {r["schedule"]: r["moe"]["heap_bytes"] for r in data["results"]}

    _, meta, default = heaps([])
    assert meta["max_recv"] is None
    out, meta, small = heaps(["--max-recv", str(2 * T * K)])
    assert meta["max_recv"] == 2 * T * K and f"max_recv {2 * T * K} rows" in out
    _, _, full = heaps(["--max-recv", str(W * T * K)])
    assert full == default
    for name in default:
        assert default[name] - small[name] == (W * T * K - 2 * T * K) * H * 2, name
    status, out, err = _run(["simulate", bounded, "--machine", machine, "--world", str(W), "--tokens", str(T),
                             "--hidden", str(H), "--topk", str(K), "--max-recv", "10"], capsys)
    assert status == 1 and out == ""
    assert "rows to rank" in err and "more than --max-recv 10: that call would be refused" in err
    status, out, err = _run(["simulate", str(ROOT / "examples" / "moe_prefill.strata"), "--machine", machine,
                             "--world", str(W), "--tokens", str(T), "--max-recv", "100"], capsys)
    assert status == 1 and "moe_prefill_dispatch's window has none" in err


def test_max_recv_sizes_the_region_of_each_expert(tmp_path, capsys):
    """--max-recv R on a window in regions (per_expert(R)): L = experts / world regions of R rows,
    so the heap per rank moves by exactly L x hidden x 2 bytes (bf16) per row of R; the default is
    world x tokens; a sample routing that sends one expert more than R rows is one error line that
    names the expert and its rows, counted here from the same ids."""
    from stratac.verify.routing import expert_ids
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    experts = str(ROOT / "examples" / "moe_prefill_experts.strata")
    W, T, H, K, E = 4, 64, 256, 4, 16
    base = ["simulate", experts, "--machine", machine, "--world", str(W), "--tokens", str(T),
            "--hidden", str(H), "--topk", str(K), "--experts", str(E)]

    def heaps(extra):
        out_json = tmp_path / "m.json"
        status, out, err = _run(base + extra + ["--json", str(out_json)], capsys)
        assert status == 0, err
        return {r["schedule"]: r["moe"]["heap_bytes"] for r in json.loads(out_json.read_text())["results"]}

    per = np.bincount(np.concatenate([expert_ids("uniform", r, T, K, E, 0).ravel() for r in range(W)]),
                      minlength=E)
    need = int(per.max())
    default, exact = heaps([]), heaps(["--max-recv", str(need)])
    assert default == heaps(["--max-recv", str(W * T)])
    for name in default:
        assert default[name] - exact[name] == (E // W) * (W * T - need) * H * 2, name
    status, out, err = _run(base + ["--max-recv", str(need - 1)], capsys)
    assert status == 1 and out == ""
    assert (f"sends {need} rows to expert {int(per.argmax())}, more than --max-recv {need - 1}: that call "
            "would be refused") in err


def test_capacity_sizes_the_slots(tmp_path, capsys):
    """--capacity C: a slotted (decode) window of experts x C rows per rank. The heap per rank of
    each schedule (its window is a parameter of both) is the default's at C = tokens and smaller by
    exactly experts x (tokens - C) x hidden x 2 bytes (bf16) below it, and C shows in the JSON; a
    sample routing past C, and C for a packed window, are one error line each."""
    machine = str(ROOT / "machines" / "cloudmatrix384.toml")
    decode = str(ROOT / "examples" / "moe_decode.strata")
    W, T, H, K, E = 4, 64, 256, 4, 64

    def heaps(extra):
        out_json = tmp_path / "c.json"
        status, out, err = _run(["simulate", decode, "--machine", machine, "--world", str(W), "--tokens",
                                 str(T), "--hidden", str(H), "--topk", str(K), "--experts", str(E), *extra,
                                 "--json", str(out_json)], capsys)
        assert status == 0, err
        data = json.loads(out_json.read_text())
        return data["meta"]["moe"], {r["schedule"]: r["moe"]["heap_bytes"] for r in data["results"]}

    meta, default = heaps([])
    assert meta["capacity"] is None
    _, full = heaps(["--capacity", str(T)])
    assert full == default
    meta, small = heaps(["--capacity", "20"])
    assert meta["capacity"] == 20
    for name in default:
        assert default[name] - small[name] == E * (T - 20) * H * 2, name
    status, out, err = _run(["simulate", decode, "--machine", machine, "--world", str(W), "--tokens", str(T),
                             "--hidden", str(H), "--topk", str(K), "--experts", str(E), "--capacity", "2"],
                            capsys)
    assert status == 1 and out == ""
    assert "more than --capacity 2: that call would be refused" in err
    status, out, err = _run(["simulate", str(ROOT / "examples" / "moe_prefill.strata"), "--machine", machine,
                             "--world", str(W), "--tokens", str(T), "--capacity", "8"], capsys)
    assert status == 1 and "moe_prefill_dispatch's window has none" in err
