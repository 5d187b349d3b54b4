"""Predictions of collectives: the model's figures against hand-computed values on the tiny
machine, and against the shipped machine file. No test asserts anything about real hardware; the
figures are the model's own arithmetic."""

import pytest
from simkit import PUSH, TINY, example, schedule

from stratac import ir
from stratac.ir import passes
from stratac.tools.simulate.predict import predict, predict_count
from stratac.tools.simulate.stage_cost import stage_cost
from stratac.tools.simulate.template import lengths, template

# ---- the model's arithmetic on the tiny machine (1 core, 1 SDMA queue) ----
# barrier = 2 SyncAll + ceil(world / cores) flag issues + fabric latency (world > 1)
# stage   = max(busiest core, busiest queue, own link, own HBM) + SyncAll + latency if remote

def test_local_aiv_copy_is_bytes_over_bandwidth_plus_latency(tmp_path, tiny):
    s = schedule(tmp_path, PUSH.format(engine="aiv"))
    us, path, _ = predict_count(s, tiny, world=1, count=1000)
    nbytes = 1000 * 4
    barrier = 2 * 1.0 + 1 * 0.5                       # world 1: no fabric latency
    stage = nbytes / 2e3 + 1.0                        # GM -> UB at 2 GB/s (UB -> GM is faster)
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["aiv"] == pytest.approx(nbytes / 2e3)
    assert sum(path.values()) == pytest.approx(us)


def test_remote_aiv_copy_is_bound_by_the_link(tmp_path, tiny):
    s = schedule(tmp_path, PUSH.format(engine="aiv"))
    us, path, _ = predict_count(s, tiny, world=2, count=1000)
    b = 4000                                          # bytes per block
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    # the core moves 2 blocks (2b in at 2 GB/s = 4 us); the link sends 1 block at 0.5 GB/s = 8 us
    stage = b / 500 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["fabric"] == pytest.approx(b / 500) and path.get("aiv", 0.0) == 0.0


def test_sdma_copy_pays_queue_bandwidth_and_posts(tmp_path, tiny):
    s = schedule(tmp_path, PUSH.format(engine="sdma"))
    us, path, _ = predict_count(s, tiny, world=2, count=1000)
    b = 4000
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    stage = 2 * b / 500 + 2 * 5.0 + 1.0 + 3.0         # one queue: 2 blocks at 0.5 GB/s, 2 posts
    assert us == pytest.approx(10.0 + barrier + stage + barrier)
    assert path["sdma"] == pytest.approx(2 * b / 500 + 2 * 5.0)


def test_two_shot_by_hand(tiny):
    s = passes.pipeline(example("allreduce_twoshot"), passes.Options())
    us, path, _ = predict_count(s, tiny, world=2, count=1000)
    part = 500 * 4                                    # bytes of one rank's slice
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    # reduce: reads its slice from 2 ranks (2 x part at 2 GB/s = 2 us), 1 of them over the link (4 us)
    reduce = part / 500 + 1.0 + 3.0
    # all-gather: one SDMA copy to the peer: part / 0.5 GB/s + one post (9 us) > link (4 us)
    gather = part / 500 + 5.0 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + barrier + reduce + gather + barrier)


def test_the_agreement_is_charged_once_and_a_leading_barrier_is_it(tmp_path, tiny):
    """Every call begins with the ranks' agreement, a barrier. A first statement that is a world
    barrier (after lets) is fused into it, as the kernel fuses it: no extra charge. One under an
    `if` is not the first statement: the kernel runs the agreement, then that barrier."""
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    lead = PUSH.format(engine="aiv")
    first = lead.replace("  barrier\n  on", "  let k = world\n  barrier\n  on", 1)
    under_if = lead.replace("  barrier\n  on", "  if world > 0 { barrier }\n  on", 1)
    none = lead.replace("  barrier\n  on", "  on", 1)
    times = {name: predict_count(schedule(tmp_path, text, f"{name}.strata"), tiny, world=2, count=1000)[0]
             for name, text in (("lead", lead), ("first", first), ("under_if", under_if), ("none", none))}
    assert times["lead"] == pytest.approx(times["first"]) == pytest.approx(times["none"])
    assert times["under_if"] == pytest.approx(times["none"] + barrier)


NODES = """
schedule nodes(x: sym T[n]) implements allreduce(x, sum) {
  requires world % 2 == 0
  team node = block(2)
  on sdma: for p in node.peers: x@p = x
  barrier(node)
  on aiv: for p in node.peers: x@p = x
  barrier(node)
}
"""


def test_the_barriers_of_different_nodes_do_not_wait_for_each_other(tmp_path, tiny):
    """Each node of two ranks sends over its own links and meets at its own barrier, so after the
    agreement (a barrier of every rank: two SyncAlls, a flag per rank on the tiny machine's one
    core, a fabric latency) a call takes as long at world 32 as at world 2. (The model once started
    each node's phase at the barrier of the node before it: 16 nodes took 16 phases.) A team's
    barrier signals its members only: the same two SyncAlls, two flags and a latency."""
    s = schedule(tmp_path, NODES)
    agreement = lambda world: 2 * 1.0 + world * 0.5 + 3.0
    times = {w: predict_count(s, tiny, w, 1000)[0] - agreement(w) for w in (2, 4, 16, 32)}
    assert times[4] == pytest.approx(times[2], rel=1e-12)
    assert times[32] == pytest.approx(times[2], rel=1e-12)
    no_barriers = schedule(tmp_path, NODES.replace("  barrier(node)\n", ""), "bare.strata")
    bare = predict_count(no_barriers, tiny, 2, 1000)[0] - agreement(2)
    assert times[2] == pytest.approx(bare + 2 * (2 * 1.0 + 2 * 0.5 + 3.0), rel=1e-12)


@pytest.mark.parametrize("hold", [True, False])
def test_a_wait_for_a_slot_its_signal_left_out_never_returns(hold, tmp_path, tiny, monkeypatch):
    """Rank 0 signals slot 0 of every peer but itself, then waits for its own: held as a set
    (template.Held) or listed, nobody provides it."""
    from stratac.tools.simulate import template as tpl
    from stratac.tools.simulate.machine import SimulateError
    monkeypatch.setattr(tpl, "HOLD_EVERY", hold)
    s = schedule(tmp_path, """
schedule left_out(x: sym T[n]) implements allreduce(x, sum) {
  flag solo[1]
  if rank == 0 { for p in peers: signal solo[0]@p }
  wait solo[0]
}
""")
    with pytest.raises(SimulateError, match="waits for a flag or barrier nobody provides"):
        predict_count(s, tiny, 3, 100)


FLAGS = """
schedule flags(x: sym T[n]) implements allreduce(x, sum) {
  flag a[world]
  for p in peers: signal a[rank]@p
  for p in peers: wait a[p]
}
"""


def test_a_shared_loop_of_signals_costs_the_busiest_cores_share(tmp_path):
    """The cores share a block's loops of signals (ir.control): at world 16 on 4 cores each issues
    at most 4 of the 15 flags. A flag with rounds keeps the block on core 0: 15 flags."""
    from stratac.tools.simulate.machine import load_machine
    (tmp_path / "four.toml").write_text(TINY.replace("vector_cores = 1", "vector_cores = 4"))
    four = load_machine(tmp_path / "four.toml")
    shared = schedule(tmp_path, FLAGS)
    alone = schedule(tmp_path, FLAGS.replace("flag a[world]", "flag a[world] rounds 2"), "r.strata")
    launch, agreement = 10.0, 2 * 1.0 + 4 * 0.5 + 3.0      # 16 barrier slots over 4 cores
    wait = 3.0 + 1.0                                      # the last flag's latency, SyncAll
    assert predict_count(shared, four, 16, 100, cores=4)[0] == pytest.approx(
        launch + agreement + (4 * 0.5 + 1.0) + wait)
    assert predict_count(alone, four, 16, 100, cores=4)[0] == pytest.approx(
        launch + agreement + (15 * 0.5 + 1.0) + wait)
    assert predict_count(shared, four, 16, 100, cores=1)[0] == pytest.approx(
        launch + 2 * 1.0 + 16 * 0.5 + 3.0 + (15 * 0.5 + 1.0) + wait)


ASYNC = """
schedule posted(x: sym T[n]) implements allreduce(x, sum) {
  scratch s: sym T[n]
  scratch u: sym T[n]
  on sdma async h: s = x
  on ENGINE: u = x
  await h
}
"""


def test_a_posted_stage_overlaps_what_follows_until_its_await(tmp_path, tiny):
    """World 1, 1000 f32 (4000 bytes) on the tiny machine. The posted SDMA copy: its core issues
    one SQE and one quiet (4 us); the queue moves 4000 bytes at 500 per us (8 us) plus a post
    (5 us). Synchronous it would take 13 us + SyncAll. Posted, the core goes on after 4 us: a
    vector-core copy (4000 bytes GM -> UB at 2000 per us: 2 us + SyncAll) runs beside the queue,
    and its quiet waits until the queue's copy has landed (13 us after the post), then SyncAll;
    the await adds its SyncAll. An SDMA copy instead queues behind the posted one."""
    start = 10.0 + 2 * 1.0 + 0.5                      # launch, the agreement of one rank
    aiv = schedule(tmp_path, ASYNC.replace("ENGINE", "aiv"), "aiv.strata")
    assert predict_count(aiv, tiny, 1, 1000)[0] == pytest.approx(start + 13.0 + 1.0 + 1.0)
    sync = schedule(tmp_path, ASYNC.replace("ENGINE", "aiv").replace(" async h", "")
                    .replace("  await h\n", ""), "sync.strata")
    assert predict_count(sync, tiny, 1, 1000)[0] == pytest.approx(start + (13.0 + 1.0) + (2.0 + 1.0))
    sdma = schedule(tmp_path, ASYNC.replace("ENGINE", "sdma"), "sdma.strata")
    assert predict_count(sdma, tiny, 1, 1000)[0] == pytest.approx(start + 13.0 + (13.0 + 1.0) + 1.0)


def test_partition_follows_the_kernel_blocks(tmp_path, tiny):
    # 1000 f32 = 125 blocks of 32 B over 2 cores: 62 and 63 blocks; the busiest core sets the time
    s = schedule(tmp_path, PUSH.format(engine="aiv"))
    t = template(s, 1, {"n": 1000})
    cost = stage_cost(t, next(iter(t.stages)), lengths(t, {"n": 1000}), 4, tiny, 2)
    assert cost.busy_us[0] == pytest.approx(63 * 32 / 2e3)


def test_auto_picks_sdma_per_piece_from_the_threshold(tmp_path, tiny):
    auto, aiv, sdma = (schedule(tmp_path, PUSH.format(engine=e), f"{e}.strata")
                       for e in ("auto", "aiv", "sdma"))
    threshold = passes.SDMA_THRESHOLD // 4            # elements
    for count, same in ((threshold - 8, aiv), (threshold, sdma)):
        got = predict_count(auto, tiny, world=2, count=count)[0]
        assert got == pytest.approx(predict_count(same, tiny, world=2, count=count)[0])


def test_flags_wait_for_the_last_signal(tiny):
    s = passes.pipeline(example("allreduce_twoshot_flags"), passes.Options())
    us, _, _ = predict_count(s, tiny, world=2, count=1000)
    part = 2000
    signal = 1 * 0.5 + 1.0                            # one slot per signal event, then SyncAll
    wait = 3.0 + 1.0                                  # the peer's flag lands one latency later
    agreement = 2 * 1.0 + 2 * 0.5 + 3.0               # the ranks' agreement: a barrier
    reduce = part / 500 + 1.0 + 3.0
    gather = part / 500 + 5.0 + 1.0 + 3.0
    assert us == pytest.approx(10.0 + agreement + reduce + gather + signal + wait)


def test_step_loop_charges_each_step_its_own_moves_and_handshake(tiny):
    # ring AllReduce at world 3: 4 steps (2 reduce on aiv, 2 copy on sdma); each step is a wait for
    # the previous rank's flag, ONE part's move, a signal; a step must not cost the moves of all
    # the loop's steps (the stage instance of each step holds only that step's moves)
    s = passes.pipeline(example("allreduce_ring"), passes.Options())
    us, path, _ = predict_count(s, tiny, world=3, count=3000)
    part = 1000 * 4
    signal = 1 * 0.5 + 1.0                            # one slot, then SyncAll
    wait = 3.0 + 1.0                                  # the flag lands a latency after the signal
    reduce = part / 500 + 1.0 + 3.0                   # the link (8 us) beats the core's 2 us
    copy = part / 500 + 5.0 + 1.0 + 3.0               # one queue: bytes + one SQE's post
    entry = 2 * 1.0 + 3 * 0.5 + 3.0                   # the ranks' agreement, a barrier: 2 SyncAlls,
    #                                                   a flag to each of 3 ranks (one core), a latency
    steps = (reduce + signal) + (wait + reduce + signal) + 2 * (wait + copy + signal)
    assert us == pytest.approx(10.0 + entry + steps + wait)
    # the whole call's link load (4 parts per rank at 0.5 GB/s = 32 us) does not bind it
    assert path["fabric"] == pytest.approx(2 * part / 500)
    assert path["sdma"] == pytest.approx(2 * (part / 500 + 5.0))


def test_ring_approaches_the_link_bound_at_large_messages(cm384):
    # a ring sends 2 (n - 1) / n of the buffer per rank, as two-shot does: at 256 MiB both are
    # bound by the links, the ring's extra cost is per-step latency only (a few percent here)
    size = 256 << 20
    two = predict(example("allreduce_twoshot"), cm384, 16, [size])[0]
    ring = predict(example("allreduce_ring"), cm384, 16, [size])[0]
    assert ring.bound == "fabric"
    assert two.time_us <= ring.time_us <= 1.2 * two.time_us


# ---- against the real machine file ----


def test_staging_baseline_is_predicted_slower_than_two_shot(cm384):
    sizes = [1 << 20, 64 << 20, 256 << 20]
    two = predict(example("allreduce_twoshot"), cm384, 16, sizes)
    staged = predict(example("allreduce_staging_baseline"), cm384, 16, sizes)
    for a, b in zip(two, staged):
        assert a.size == b.size
        assert b.time_us > a.time_us
        assert b.busbw < a.busbw
    # at 256 MiB the two extra full-buffer copies are at least 2 x 2S of HBM traffic more
    assert staged[-1].time_us - two[-1].time_us >= 2 * 2 * (256 << 20) / (cm384.hbm_gbps * 1e3)


def test_large_world_stays_cheap(cm384):
    preds = predict(example("allreduce_twoshot"), cm384, 384, [8, 256 << 20])
    assert [p.count for p in preds] == [2, 64 << 20]
    assert preds[-1].bound == "fabric"
    assert 0 < preds[-1].busbw <= cm384.fabric_gbps


# what the examples lack: a reduction over the peers (each rank's own part left out: a prediction
# needs no proof), a pull over the peers, accumulates into every peer, runs on `auto` (decided
# piece by piece), a run written to one fixed rank, and team sets that do not hold their issuer,
# with loads that differ from rank to rank (the examples' are the same on every rank)
HELD = {
    "peers_reduce": """
schedule peers_reduce(x: sym T[n], acc: sym T[n]) implements allreduce(x, sum) {
  part = split(x, world)
  into = split(acc, world)
  on aiv: into[rank] = sum(part[rank]@p for p in peers)
  on sdma: for p in peers: part[rank]@p = into[rank]
}
""",
    "pull_accumulate_auto": """
schedule pull_accumulate_auto(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  on auto: for p in peers: blk[p] = x@p
  on aiv: for p in peers: blk[rank]@p += x
  on auto: for p in ranks: blk[p]@0 = x
}
""",
    "uneven_teams": """
schedule uneven_teams(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  requires world % 2 == 0
  team odd = stride(2)
  team pair = block(2)
  blk = split(out, world)
  if rank < 3 {
    on sdma: for i in 0 .. world / 2: blk[rank]@(2 * i + 1) = x
    on aiv: for i in 0 .. 2: blk[rank]@i += x     # rank 2: the rank after the set's last
  }
  if rank % 3 == 0 {
    on aiv: for p in odd.peers: blk[rank]@p += x
    on aiv: blk[rank] = sum(blk[rank]@p for p in odd.ranks)
  }
  on aiv: blk[rank] = sum(blk[rank]@p for p in pair.ranks)
}
""",
    # signals and waits held as sets (template.Held): to a rotation of the ranks (two pieces),
    # waited for as sets; a set of slots signalled one by one; a slot signalled as a set and
    # waited for alone; a slot set by several held signals of disjoint ranks (one per node)
    "flag_sets": """
schedule flag_sets(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  requires world % 2 == 0
  flag done[world]
  flag got[world]
  flag again[world]
  flag pair[2]
  flag all[world]
  blk = split(out, world)
  on sdma: for p in peers: blk[rank]@p = x
  for s in 1 .. world { signal done[rank]@((rank + s) % world) }
  for s in 1 .. world { wait done[(rank + s) % world] }
  signal got[rank]@0
  if rank == 0 { for p in peers: wait got[p] }
  on aiv: blk[rank]@((rank + 1) % world) = x
  for p in peers: signal again[rank]@p
  if world > 2 { wait again[(rank + 1) % world] }
  on aiv: blk[rank] = x
  for i in 0 .. 2: signal pair[rank % 2]@(rank / 2 * 2 + i)
  for i in 0 .. 2: wait pair[i]
  if rank == 0 { on sdma: blk[rank]@1 = x }
  for p in ranks: signal all[rank]@p         # a set that holds its issuer (rank 0 sets its own last)
  for p in ranks: wait all[p]
  if rank == 0 { on sdma: blk[rank]@1 = x }    # and ends the call last
}
""",
}
HELD_EXAMPLES = ["allreduce_oneshot", "allreduce_twoshot", "reduce", "reducescatter",
                 "allreduce_staging_baseline", "allgather_push", "allgather_pull", "alltoall",
                 "allreduce_twoshot_flags", "allreduce_hierarchical", "allreduce_groups",
                 "allreduce_hierarchical_composed", "allreduce_reduce_on_write", "broadcast"]


@pytest.mark.parametrize("name", HELD_EXAMPLES + list(HELD))
def test_sources_and_runs_held_as_one_entry_predict_as_listed_moves(name, cm384, tiny, tmp_path,
                                                                   monkeypatch):
    """A reduction over every rank or peer (`sum(x@p for p in ranks)`) holds its sources as one
    code, and a loop of copies over the ranks or peers inside a stage is one entry standing for its
    moves (template.HOLD_EVERY), so that a template does not grow with the world's square. The
    prediction, and every part of its critical path, are those of the same template with every
    move and source listed, at worlds 1-7, at a size below and above a rank's block, on five
    machines: CloudMatrix384, the tiny one, and three variants of it, each making one resource set
    the time: HBM slower than the link; SQEs of 64 bytes that the queue posts at once, so that a
    core's SQE issue binds and a core posts more than a quiet window holds (its quiets counted
    post by post); and UB -> GM slower than GM -> UB."""
    from stratac.tools.simulate import template as tpl
    from stratac.tools.simulate.machine import SimulateError, load_machine
    variants = []
    for i, changes in enumerate([{"hbm_gbps = 1000.0": "hbm_gbps = 0.05"},
                                 {"sqe_bytes = 1048576": "sqe_bytes = 64", "post_us = 5.0": "post_us = 0.001",
                                  "queue_gbps = 0.5": "queue_gbps = 1000.0"},
                                 {"ub_to_gm_gbps = 4.0": "ub_to_gm_gbps = 0.1"}]):
        text = TINY
        for a, b in changes.items():
            assert a in text
            text = text.replace(a, b)
        (tmp_path / f"m{i}.toml").write_text(text)
        variants.append(load_machine(tmp_path / f"m{i}.toml"))
    s = schedule(tmp_path, HELD[name]) if name in HELD else \
        passes.pipeline(example(name), passes.Options())
    seen, hbm_bound = 0, 0
    for m in (tiny, cm384, *variants):
        for world in (*range(1, 8), 8, 12, 16):      # teams of 2, 4, 8 and lanes of 1-4 ranks
            for count in (3, 1000 * world + 5):
                got = {}
                for hold in (True, False):
                    monkeypatch.setattr(tpl, "HOLD_EVERY", hold)
                    try:
                        got[hold] = predict_count(s, m, world, count)
                    except SimulateError as exc:      # a world the schedule does not support
                        got[hold] = repr(exc)
                if isinstance(got[True], str):
                    assert got[True] == got[False]
                    continue
                (us, path, t), (us2, path2, t2) = got[True], got[False]
                assert us == pytest.approx(us2, rel=1e-12), (m.name, world, count)
                assert path == pytest.approx(path2, rel=1e-12), (m.name, world, count)
                # and every stage's time and link and HBM loads on every rank, critical or not
                env = {**{n: count for n in s.sizes}, **{x.name: 0 for x in s.rank_params},
                       **ir.elem_env(s, 4)}    # as predict_count's
                for i in t.stages:
                    a, b = (stage_cost(x, i, lengths(x, env), 4, m, m.vector_cores) for x in (t, t2))
                    assert a.time_us == pytest.approx(b.time_us, rel=1e-12), (m.name, world, count, i)
                    assert a.loads.keys() == b.loads.keys()
                    for ph in a.loads:
                        for x, y in zip(a.loads[ph], b.loads[ph]):
                            assert x == pytest.approx(y, rel=1e-12, abs=1e-9), (m.name, world, count, i)
                seen += any(e != tpl.LISTED or c > 1 for sm in t.stages.values()
                            for e, c in zip(sm.src_set, sm.count)) or \
                    any(isinstance(i, tpl.Held) for tl in t.timelines
                        for kind, arg in tl if kind == "wait" for _, (i, _) in arg)
                hbm_bound += path.get("hbm", 0.0) > 0
    assert seen and hbm_bound   # the schedule has such an entry, and HBM bound some call
