"""The Python API on real rank processes (torch.distributed bootstrap, shared memory)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_ranks(scenario, world, tmp_path, mode="pg", env=None) -> list[str]:
    """Runs scenario on world rank processes; their stdouts."""
    store = tmp_path / "store"
    if store.exists():
        store.unlink()
    procs = [subprocess.Popen([sys.executable, str(HERE / "ranks.py"), scenario, str(r), str(world),
                               str(store), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **(env or {})}) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert f"PASS {scenario}" in out
    return [out for out, _ in outs]


def run_many_ranks(scenario, world, tmp_path, timeout=600) -> None:
    """Runs scenario on world rank processes forked from a server that imported torch once
    (stratac.tools.run.procs, as `stratac run` starts its ranks): at tens of ranks, starting each
    afresh would spend a minute importing torch."""
    from stratac.tools.run import procs
    store = tmp_path / "store"
    files = [(open(tmp_path / f"{r}.out", "w+"), open(tmp_path / f"{r}.err", "w+")) for r in range(world)]
    ranks = [procs.Rank([str(HERE / "ranks.py"), scenario, str(r), str(world), str(store), "pg"],
                        out, err, dict(os.environ), cwd=str(HERE)) for r, (out, err) in enumerate(files)]
    try:
        codes = [p.wait(timeout=timeout) for p in ranks]
    finally:
        procs.kill(ranks)
    for r, (code, (out, err)) in enumerate(zip(codes, files)):
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
        assert code == 0 and f"PASS {scenario}" in text, f"rank {r}: {errors[-3000:]}"


@pytest.mark.slow
def test_a_mask_above_64_ranks_drops_the_masked_ranks_experts(tmp_path):
    """Masks are a bitmap in the sync area, not a 64-bit argument: at world 72, ranks 3, 66 and 70
    sit out a masked dispatch and combine, and every live rank's counts, window and output are
    what the routing without the masked experts gives."""
    run_many_ranks("moe_masks_wide", 72, tmp_path)


@pytest.mark.parametrize("scenario", ["interleaved", "bad_input", "segment_gone", "closed",
                                      "moe_bad_input", "moe_masks", "moe_bounded", "moe_interleaved", "call_refusals",
                                      "half_sums_round_once", "cached_calls",
                                      "selecting_entry_point", "several_communicators", "divisor_params"])
def test_scenario_process_group(scenario, tmp_path):
    run_ranks(scenario, 3, tmp_path)


def test_a_verdict_on_disk_is_reused_and_a_corrupt_one_is_proven_again(tmp_path):
    """The instance of a call is proven once for all ranks and all later jobs: the first job runs
    the verifier once (one rank proves, the other waits for its verdict), the next job not at all;
    a verdict file corrupted on disk is proven again and rewritten, never believed."""
    env = {"STRATAC_CACHE_DIR": str(tmp_path / "cache")}

    def verified() -> int:
        outs = run_ranks("verdict_cache", 2, tmp_path, env=env)
        return sum(int(re.search(r"^VERIFIED (\d+)$", out, re.MULTILINE).group(1)) for out in outs)

    assert verified() == 1
    kept = sorted((tmp_path / "cache" / "verdicts").glob("allreduce_twoshot-*.json"))
    # the call's verdict, beside the file's proof at the world that comm.load keeps (prove_worlds)
    files = [f for f in kept if "default samples" not in json.loads(f.read_text())["fields"]["params"]]
    assert len(files) == 1 and len(kept) == 2
    good = files[0].read_text()
    assert verified() == 0
    files[0].write_text(good.replace('"world": 2', '"world": 3'))   # valid JSON, another instance
    assert verified() == 1
    assert proven(files[0].read_text()) == proven(good)
    files[0].write_text(good[:len(good) // 2])                      # truncated
    assert verified() == 1
    assert proven(files[0].read_text()) == proven(good)


def proven(verdict_text: str):
    """What a verdict file says was proven, about which instance (not how long it took)."""
    data = json.loads(verdict_text)
    return data["fields"], data["proof"]


def test_bootstrap_from_a_store(tmp_path):
    run_ranks("interleaved", 2, tmp_path, mode="store")
