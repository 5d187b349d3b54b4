"""`stratac simulate`: the machine file's checks, the model's figures against hand-computed values
on a tiny machine, the template against stratac.instantiate, and the output format. No test
asserts anything about real hardware; the figures are the model's own arithmetic."""

import argparse
import json
from pathlib import Path

import pytest

from stratac import ir
from stratac.ir import instantiate, passes
from stratac.lang import frontend
from stratac.tools.run.workload import MoeWorkload
from stratac.tools.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.strata"))

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


# ---- MoE routing on the tiny machine: built from the sample routing, by hand ----
# c0 = SCALAR_CALL_US per routing call, e = SCALAR_ELEMENT_US per id/count/offset (assumptions)

# prefill dispatch with place on `{engine}`, and its combine
MOE = """
schedule d(x: sym T[tokens, hidden], ids: i32[tokens, topk], counts: sym i32[world, experts],
           win: sym T[world * tokens * topk, hidden]) implements moe_dispatch(x, ids -> win, counts) {{
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv: mine[rank] = histogram(ids)
  barrier
  on sdma: for p in peers: mine[rank]@p = mine[rank]
  barrier
  on aiv: offs = exscan(counts)
  on {engine}: win = place(x, ids, offs)
  barrier
}}
"""
C0, E1 = simulate.SCALAR_CALL_US, simulate.SCALAR_ELEMENT_US


def _moe_cost(s: ir.Schedule, m, world: int, tokens: int, routing: str, stage: int, cores: int = 1,
              hidden: int = 256, elem: int = 2):
    """The StageCost of stage `stage` (numbered from 1) of s at these sizes (topk 1, one expert per
    rank)."""
    env = _moe_env(s, world, tokens, hidden, 1, world)
    t = simulate.template(s, world, env)
    routed = simulate.Routed.sample(routing, world, tokens, 1, world)
    return simulate.stage_cost(t, stage, simulate.lengths(t, env), elem, m, cores, routed)


def test_moe_place_to_one_peer_is_rows_over_the_link(tmp_path, tiny):
    # routing `single`: every token picks expert 0, which lives on rank 0; rank 1 sends all its rows
    s = _schedule(tmp_path, MOE.format(engine="aiv"))
    T, H, rb = 100, 256, 256 * 2                      # bf16 rows of 512 bytes
    preds = simulate.predict_moe(s, tiny, 2, [T], simulate.MoeSpec(hidden=H, topk=1, experts=2,
                                                                  routing="single"), "bf16")
    p = preds[0]
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    histogram = C0 + (T + 2) * E1 + 1.0               # core 0 reads 100 ids, writes 2 counts
    counts = 8 / 500 + 5.0 + 1.0 + 3.0                # one i32 count row (8 bytes, not 4: bf16 kernel)
    exscan = C0 + (2 * 2 + 2) * E1 + 1.0              # world x experts counts read, 2 offsets written
    place = T * rb / 500 + 1.0 + 3.0                  # 100 rows over rank 1's link at 0.5 GB/s
    assert T * rb / 2e3 + C0 + 3 * T * E1 < T * rb / 500   # the core (ids, rows) is faster than the link
    assert p.time_us == pytest.approx(10.0 + histogram + barrier + counts + barrier + exscan + place + barrier)
    assert p.breakdown_us["fabric"] == pytest.approx(T * rb / 500)
    assert p.breakdown_us["scalar"] == pytest.approx(2 * C0 + (T + 2 + 6) * E1)
    assert p.bound == "fabric"
    # rank 0 receives every row, rank 1 none: the mean is what a rank receives
    assert p.moe["received_rows"] == T and p.moe["received_rows_max"] == 2 * T
    assert p.size == T * rb
    assert p.algbw == pytest.approx(T * rb / p.time_us / 1e3)


def test_moe_place_on_sdma_posts_one_copy_per_row(tmp_path, tiny):
    s = _schedule(tmp_path, MOE.format(engine="sdma"))
    T, rb = 100, 512
    cost = _moe_cost(s, tiny, 2, T, "single", stage=4)
    scan = C0 + (T + T + T) * E1      # count the routed ids, scan to the last one, read 100 offsets
    # one queue: 100 rows at 0.5 GB/s and 100 posts, after the core's scalar work
    assert cost.busy_us[1] == pytest.approx(scan + T * rb / 500 + T * 5.0)
    assert cost.scalar_us[1] == pytest.approx(scan)
    assert cost.category[1] == "sdma"
    assert cost.time_us[1] == pytest.approx(cost.busy_us[1] + 1.0 + 3.0)
    assert cost.time_us[0] == pytest.approx(cost.busy_us[0] + 1.0)   # rank 0's rows stay local


def test_moe_place_splits_the_routed_rows_evenly_over_the_cores(tmp_path, tiny):
    # 7 routed rows on 4 cores: core c takes rows [7c/4, 7(c+1)/4): 1, 2, 2, 2; the last core has
    # scanned all 7 ids twice (count, then up to its last row)
    four = simulate.Machine(**{**tiny.__dict__, "vector_cores": 4})
    s = _schedule(tmp_path, MOE.format(engine="aiv"))
    rows, scanned = simulate.Routed.sample("single", 1, 7, 1, 1).place_split(4)
    assert rows.tolist() == [[1, 2, 2, 2]] and scanned.tolist() == [[8, 10, 12, 14]]
    cost = _moe_cost(s, four, 1, 7, "single", stage=4, cores=4)
    assert cost.busy_us[0] == pytest.approx(C0 + (14 + 2) * E1 + 2 * 512 / 2e3)
    assert cost.category[0] == "aiv"


def test_moe_gather_by_hand(tiny):
    s = passes.pipeline(frontend.schedules(frontend.load_source(
        ROOT / "examples" / "moe_prefill.strata"))[1], passes.Options())
    T, H, rb = 100, 256, 512
    p = simulate.predict_moe(s, tiny, 2, [T], simulate.MoeSpec(hidden=H, topk=1, experts=2,
                                                              routing="single"), "bf16")[0]
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    exscan = C0 + 6 * E1 + 1.0
    # rank 1 reads its 100 rows from rank 0 over its link (102.4 us); its core: 100 rows in (25.6 us),
    # 100 token rows out (12.8 us), f32 vector passes: 3 per entry, 2 per token (500 x 1 KiB / 8 GB/s)
    core = (100 * 3 + 100 * 2) * H * 4 / 8e3 + C0 + (T + 2 * T) * E1
    assert core < T * rb / 500
    gather = T * rb / 500 + 1.0 + 3.0
    assert p.time_us == pytest.approx(10.0 + exscan + barrier + gather + barrier)
    assert p.bound == "fabric"


def test_moe_typed_count_rows_move_as_their_own_bytes(tmp_path, tiny):
    # the count row is 2 i32 = 8 bytes whatever the token dtype (strata::Ratio)
    s = _schedule(tmp_path, MOE.format(engine="aiv"))
    for elem in (2, 4):
        cost = _moe_cost(s, tiny, 2, 4, "uniform", stage=2, elem=elem)
        assert cost.busy_us[0] == pytest.approx(8 / 500 + 5.0)


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


def test_moe_staging_baseline_is_predicted_slower(cm384):
    world, tokens = 16, [64, 1024]
    prefill = [simulate.predict_moe(s, cm384, world, tokens) for s in
               frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_prefill.strata"))]
    staged = [simulate.predict_moe(s, cm384, world, tokens) for s in
              frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_staging_baseline.strata"))]
    for a, b in zip(prefill[0], staged[0]):                   # dispatch
        assert a.count == b.count and a.size == b.size and a.dtype == "bf16"
        assert b.time_us > a.time_us
        # `win = recv` copies the whole window (world * tokens * topk rows): read and written in HBM
        window = world * a.count * 8 * 7168 * 2
        assert b.time_us - a.time_us >= 2 * window / (cm384.hbm_gbps * 1e3)
        assert b.moe["heap_bytes"] > a.moe["heap_bytes"]
    for a, b in zip(prefill[1], staged[1]):                   # the same combine
        assert b.time_us == pytest.approx(a.time_us)
    big = prefill[0][-1]                                      # 1024 tokens: the links set the pace
    assert big.bound == "fabric"
    assert big.moe["received_rows"] == pytest.approx(1024 * 8)   # uniform: topk rows per token
    assert big.algbw < cm384.fabric_gbps * world / (world - 1)


def test_moe_large_world_stays_cheap(cm384):
    s = _example("moe_prefill")
    p = simulate.predict_moe(s, cm384, 384, [16])[0]
    assert p.moe["experts"] == 8 * 384 and p.time_us > 0
    # exscan reads the world x experts count table on one core: quadratic in the world at 8 experts
    # per rank, and the largest share of the call here
    assert p.bound == "scalar"
    assert p.breakdown_us["scalar"] >= 384 * 3072 * simulate.SCALAR_ELEMENT_US


def test_large_world_stays_cheap(cm384):
    preds = simulate.predict(_example("allreduce_twoshot"), cm384, 384, [8, 256 << 20])
    assert [p.count for p in preds] == [2, 64 << 20]
    assert preds[-1].bound == "fabric"
    assert 0 < preds[-1].busbw <= cm384.fabric_gbps


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_matches_instantiate(path):
    for s in frontend.schedules(frontend.load_source(path)):
        for world in (1, 2, 3, 5):
            _check_template(s, world)


def _moe_env(s: ir.Schedule, world: int, tokens: int = 5, hidden: int = 3, topk: int = 2,
             experts: int | None = None) -> dict:
    if s.contract.kind is ir.ContractKind.ALLTOALLV:
        topk, experts = 1, world
    return MoeWorkload(s, None, world, tokens, hidden, topk, experts or 2 * world).sizes(s)


def _check_template(s: ir.Schedule, world: int) -> None:
    """The model's walk of the IR gives the same moves and routing constructs, per rank and stage,
    as stratac.instantiate."""
    if s.contract.kind.moe:
        env = _moe_env(s, world)
    else:
        env = {**{n: 7 for n in s.sizes}, **{x.name: world - 1 for x in s.rank_params}}
    inst = instantiate.instantiate(s, world, env)
    t = simulate.template(s, world, env)
    lens = simulate.lengths(t, env)
    want: dict[int, list] = {}
    want_routes: dict[int, list] = {}
    for r, events in enumerate(inst.timelines):
        kinds = []
        for ev in events:
            if ev.kind is instantiate.EventKind.STAGE:
                kinds.append(("stage", ev.stage.index))
                for mv in ev.moves:
                    kind = 1 if mv.accumulate else (0 if mv.op is None else 2)
                    want.setdefault(ev.stage.index, []).append(
                        (r, kind, mv.dst[0], tuple(x[0] for x in mv.srcs), mv.dst[3] - mv.dst[2]))
                for ri in ev.routes:
                    want_routes.setdefault(ev.stage.index, []).append(
                        (ri.rank, ri.kind, ri.experts, ri.tokens, ri.topk, ri.hidden))
            elif ev.kind is instantiate.EventKind.BARRIER:
                kinds.append(("barrier", ev.barrier))
            elif ev.kind is instantiate.EventKind.SIGNAL:
                kinds.append(("signal", [(o, f, slot) for o, f, slot, _ in ev.signals]))
            elif ev.kind is instantiate.EventKind.WAIT:
                kinds.append(("wait", [(f, slot) for f, slot, _ in ev.waits]))
        assert t.timelines[r] == kinds, (world, r)
    for index, moves in want.items():
        assert t.moves(index, lens) == moves, (world, index)
    for index in t.stages:
        got = [(r, k, sh["experts"], sh.get("tokens", 0), sh.get("topk", 0), sh.get("hidden", 0))
               for r, k, sh in t.routes(index)]
        assert got == want_routes.get(index, []), (world, index)


def test_every_example_is_modelled():
    for path in EXAMPLES:
        for s in frontend.schedules(frontend.load_source(path)):
            assert simulate.not_modelled(s) is None, s.name


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
    assert data["meta"]["moe"]["assumptions"]["scalar_element_us"] == simulate.SCALAR_ELEMENT_US
    rec = data["results"][0]
    assert rec["moe"]["tokens"] == 16 and rec["count"] == 16 and rec["busbw"] == rec["algbw"]
    assert sum(rec["breakdown_us"].values()) == pytest.approx(rec["time_us"])
    assert set(rec["breakdown_us"]) == set(simulate.CATEGORIES)


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
    ("moe_prefill", ["--sizes", "1M"], "--sizes applies to collectives"),
    ("broadcast", ["--tokens", "16"], "apply to MoE and AllToAllV schedules"),
])
def test_bad_moe_requests_are_one_message(capsys, file, extra, message):
    status, out, err = _run(["simulate", str(ROOT / "examples" / f"{file}.strata"), "--machine",
                             str(ROOT / "machines" / "cloudmatrix384.toml"), "--world", "4",
                             "--tokens", "16", *extra], capsys)
    assert status == 1 and out == ""
    assert err.startswith("stratac simulate: error: ") and message in err


def test_token_sweeps():
    assert simulate.parse_tokens("16:4096") == [16 << i for i in range(9)]
    assert simulate.parse_tokens("1,8:32:4") == [1, 8, 32]
    with pytest.raises(ValueError, match="integers"):
        simulate.parse_tokens("4K")


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
