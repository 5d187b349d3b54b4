"""`stratac simulate`: the machine file's checks, the model's figures against hand-computed values
on a tiny machine, the template against stratac.instantiate, and the output format. No test
asserts anything about real hardware; the figures are the model's own arithmetic."""

import argparse
import json
from pathlib import Path

import pytest

from stratac import frontend, instantiate, ir, passes, simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.strata"))   # MoE: not modelled (below)
            if not any(s.contract.kind.moe for s in frontend.schedules(frontend.load_source(p)))]

# A machine whose figures make the hand arithmetic short: bandwidths in GB/s = 1e3 bytes per us.
TINY = """
[machine]
name = "tiny"
npus = 4
dies_per_npu = 1
[rank]
vector_cores = 1
ub_bytes_per_core = 196608
hbm_gbps = 1000.0
fabric_gbps = 0.5
fabric_latency_us = 3.0
[core]
gm_to_ub_gbps = 2.0
ub_to_gm_gbps = 4.0
vector_gbps = 8.0
[sdma]
queues = 1
queue_gbps = 0.5
post_us = 5.0
[sync]
launch_us = 10.0
sync_all_us = 1.0
flag_issue_us = 0.5
"""

# out-of-place push AllGather on each engine: rank r copies x into block r of every rank's out
PUSH = """
schedule push_{engine}(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {{
  blk = split(out, world)
  barrier
  on {engine}: for p in ranks: blk[rank]@p = x
  barrier
}}
"""


@pytest.fixture
def tiny(tmp_path) -> simulate.Machine:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return simulate.load_machine(path)


@pytest.fixture(scope="module")
def cm384() -> simulate.Machine:
    return simulate.load_machine(ROOT / "machines" / "cloudmatrix384.toml")


def _schedule(tmp_path, text: str, name: str = "s.strata") -> ir.Schedule:
    path = tmp_path / name
    path.write_text(text)
    return passes.pipeline(frontend.schedules(frontend.load_source(path))[0], passes.Options())


def _example(name: str) -> ir.Schedule:
    return frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))[0]


# ---- the model's arithmetic on the tiny machine (1 core, 1 SDMA queue) ----
# barrier = 2 SyncAll + ceil(world / cores) flag issues + fabric latency (world > 1)
# stage   = max(busiest core, busiest queue, own link, own HBM) + SyncAll + latency if remote

def test_local_aiv_copy_is_bytes_over_bandwidth_plus_latency(tmp_path, tiny):
    s = _schedule(tmp_path, PUSH.format(engine="aiv"))
    us, path, _ = simulate.predict_count(s, tiny, world=1, count=1000)
    nbytes = 1000 * 4
    barrier = 2 * 1.0 + 1 * 0.5                       # world 1: no fabric latency
    stage = nbytes / 2e3 + 1.0                        # GM -> UB at 2 GB/s (UB -> GM is faster)
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["aiv"] == pytest.approx(nbytes / 2e3)
    assert sum(path.values()) == pytest.approx(us)


def test_remote_aiv_copy_is_bound_by_the_link(tmp_path, tiny):
    s = _schedule(tmp_path, PUSH.format(engine="aiv"))
    us, path, _ = simulate.predict_count(s, tiny, world=2, count=1000)
    b = 4000                                          # bytes per block
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    # the core moves 2 blocks (2b in at 2 GB/s = 4 us); the link sends 1 block at 0.5 GB/s = 8 us
    stage = b / 500 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["fabric"] == pytest.approx(b / 500) and path.get("aiv", 0.0) == 0.0


def test_sdma_copy_pays_queue_bandwidth_and_posts(tmp_path, tiny):
    s = _schedule(tmp_path, PUSH.format(engine="sdma"))
    us, path, _ = simulate.predict_count(s, tiny, world=2, count=1000)
    b = 4000
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    stage = 2 * b / 500 + 2 * 5.0 + 1.0 + 3.0         # one queue: 2 blocks at 0.5 GB/s, 2 posts
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["sdma"] == pytest.approx(2 * b / 500 + 2 * 5.0)


def test_two_shot_by_hand(tiny):
    s = passes.pipeline(_example("allreduce_twoshot"), passes.Options())
    us, path, _ = simulate.predict_count(s, tiny, world=2, count=1000)
    part = 500 * 4                                    # bytes of one rank's slice
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    # reduce: reads its slice from 2 ranks (2 x part at 2 GB/s = 2 us), 1 of them over the link (4 us)
    reduce = part / 500 + 1.0 + 3.0
    # all-gather: one SDMA copy to the peer: part / 0.5 GB/s + one post (9 us) > link (4 us)
    gather = part / 500 + 5.0 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + barrier + reduce + gather + barrier)


def test_partition_follows_the_kernel_blocks(tmp_path, tiny):
    # 1000 f32 = 125 blocks of 32 B over 2 cores: 62 and 63 blocks; the busiest core sets the time
    s = _schedule(tmp_path, PUSH.format(engine="aiv"))
    t = simulate.template(s, 1, {"n": 1000})
    cost = simulate.stage_cost(t, next(iter(t.stages)), simulate.lengths(t, {"n": 1000}), 4, tiny, 2)
    assert cost.busy_us[0] == pytest.approx(63 * 32 / 2e3)


def test_auto_picks_sdma_per_piece_from_the_threshold(tmp_path, tiny):
    auto, aiv, sdma = (_schedule(tmp_path, PUSH.format(engine=e), f"{e}.strata")
                       for e in ("auto", "aiv", "sdma"))
    threshold = passes.SDMA_THRESHOLD // 4            # elements
    for count, same in ((threshold - 8, aiv), (threshold, sdma)):
        got = simulate.predict_count(auto, tiny, world=2, count=count)[0]
        assert got == pytest.approx(simulate.predict_count(same, tiny, world=2, count=count)[0])


def test_flags_wait_for_the_last_signal(tiny):
    s = passes.pipeline(_example("allreduce_twoshot_flags"), passes.Options())
    us, _, _ = simulate.predict_count(s, tiny, world=2, count=1000)
    part = 2000
    signal = 1 * 0.5 + 1.0                            # one slot per signal event, then SyncAll
    wait = 3.0 + 1.0                                  # the peer's flag lands one latency later
    reduce = part / 500 + 1.0 + 3.0
    gather = part / 500 + 5.0 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + signal + wait + reduce + gather + signal + wait)


# ---- against the real machine file ----

def test_staging_baseline_is_predicted_slower_than_two_shot(cm384):
    sizes = [1 << 20, 64 << 20, 256 << 20]
    two = simulate.predict(_example("allreduce_twoshot"), cm384, 16, sizes)
    staged = simulate.predict(_example("allreduce_staging_baseline"), cm384, 16, sizes)
    for a, b in zip(two, staged):
        assert a.size == b.size
        assert b.time_us > a.time_us
        assert b.busbw < a.busbw
    # at 256 MiB the two extra full-buffer copies are at least 2 x 2S of HBM traffic more
    assert staged[-1].time_us - two[-1].time_us >= 2 * 2 * (256 << 20) / (cm384.hbm_gbps * 1e3)


def test_large_world_stays_cheap(cm384):
    preds = simulate.predict(_example("allreduce_twoshot"), cm384, 384, [8, 256 << 20])
    assert [p.count for p in preds] == [2, 64 << 20]
    assert preds[-1].bound == "fabric"
    assert 0 < preds[-1].busbw <= cm384.fabric_gbps


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_matches_instantiate(path):
    """The model's walk of the IR gives the same moves, per rank and stage, as stratac.instantiate."""
    s = frontend.schedules(frontend.load_source(path))[0]
    for world in (1, 2, 3, 5):
        env = {**{n: 7 for n in s.sizes}, **{x.name: world - 1 for x in s.rank_params}}
        inst = instantiate.instantiate(s, world, env)
        t = simulate.template(s, world, env)
        lens = simulate.lengths(t, env)
        want: dict[int, list] = {}
        for r, events in enumerate(inst.timelines):
            kinds = []
            for ev in events:
                if ev.kind is instantiate.EventKind.STAGE:
                    kinds.append(("stage", ev.stage.index))
                    for mv in ev.moves:
                        kind = 1 if mv.accumulate else (0 if mv.op is None else 2)
                        want.setdefault(ev.stage.index, []).append(
                            (r, kind, mv.dst[0], tuple(x[0] for x in mv.srcs), mv.dst[3] - mv.dst[2]))
                elif ev.kind is instantiate.EventKind.BARRIER:
                    kinds.append(("barrier", ev.barrier))
                elif ev.kind is instantiate.EventKind.SIGNAL:
                    kinds.append(("signal", [(o, f, slot) for o, f, slot, _ in ev.signals]))
                elif ev.kind is instantiate.EventKind.WAIT:
                    kinds.append(("wait", [(f, slot) for f, slot, _ in ev.waits]))
            assert t.timelines[r] == kinds, (world, r)
        for index, moves in want.items():
            assert t.moves(index, lens) == moves, (world, index)


def test_moe_contracts_are_not_modelled():
    assert "MoE" in simulate.not_modelled(_example("moe_prefill"))
    assert simulate.not_modelled(_example("allreduce_twoshot")) is None


# ---- the machine file ----

def test_the_shipped_machine_file_loads(cm384):
    assert cm384.max_world == 768
    assert cm384.vector_cores == 48
    text = (ROOT / "machines" / "cloudmatrix384.toml").read_text()
    for line in text.splitlines():   # every value says where it comes from
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, line


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("fabric_gbps = 0.5\n", ""), "missing key 'fabric_gbps' in [rank]"),
    (lambda t: t.replace("queues = 1", "queues = 0"), "[sdma] queues must be an integer >= 1, got 0"),
    (lambda t: t.replace("hbm_gbps = 1000.0", 'hbm_gbps = "fast"'),
     "[rank] hbm_gbps must be a number > 0, got 'fast'"),
    (lambda t: t.replace("post_us = 5.0", "post_us = 5.0\npost_ns = 5"), "unknown key 'post_ns' in [sdma]"),
    (lambda t: t + "[gpu]\nx = 1\n", "unknown section [gpu]"),
    (lambda t: t.replace("[sync]\nlaunch_us = 10.0\nsync_all_us = 1.0\nflag_issue_us = 0.5\n", ""),
     "missing section [sync]"),
    (lambda t: t.replace("npus = 4", "npus = "), "not valid TOML"),
    (lambda t: t.replace("ub_bytes_per_core = 196608", "ub_bytes_per_core = 1024"),
     "the kernels lay out 196608 bytes of UB per core"),
])
def test_bad_machine_files_name_the_file_and_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(TINY))
    with pytest.raises(simulate.SimulateError) as exc:
        simulate.load_machine(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert message in str(exc.value)


def test_missing_machine_file(tmp_path):
    with pytest.raises(simulate.SimulateError, match="no such machine file"):
        simulate.load_machine(tmp_path / "nope.toml")


# ---- the command, through add_parser on a fresh parser ----

def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="stratac")
    simulate.add_parser(parser.add_subparsers(dest="command", required=True))
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


@pytest.mark.parametrize("extra, message", [
    (["--world", "769"], "world 769 is larger than the machine"),
    (["--world", "4", "--cores", "49"], "--cores must be between 1 and 48"),
])
def test_bad_requests_are_one_message(capsys, extra, message):
    status, out, err = _run(["simulate", str(ROOT / "examples" / "broadcast.strata"), "--machine",
                             str(ROOT / "machines" / "cloudmatrix384.toml"), *extra], capsys)
    assert status == 1 and out == ""
    assert err.startswith("stratac simulate: error: ") and message in err
    assert "Traceback" not in err


def test_bad_machine_file_through_the_command(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("vector_cores = 1\n", ""))
    status, out, err = _run(["simulate", str(ROOT / "examples" / "broadcast.strata"), "--machine",
                             str(bad), "--world", "2"], capsys)
    assert status == 1 and out == ""
    assert err == f"stratac simulate: error: {bad}: missing key 'vector_cores' in [rank] (an integer >= 1)\n"
