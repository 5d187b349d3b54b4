"""stratac.Buffer, the DeepEP-style MoE API, on real rank processes; and the MoE layer example
(examples/python/moe_layer.py) under torchrun against its single-process reference."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


SCENARIOS = ["numbers", "refusals", "overflow", "low_latency", "int8", "masked"]


@pytest.mark.slow   # about 35 s on 2 CPUs: 4 rank processes importing torch and loading the schedules
def test_buffer_scenarios(tmp_path):
    """In the same 4 rank processes: numbers: received rows, rows per expert, combined tokens, and
    every rank's bytes (routing and the CPU model's counters) against a reference computed from
    every rank's routing; refusals: each bad argument is named; overflow: a routing past max_recv
    raises on every rank and writes no window; low_latency: numbers for the decode schedules; int8:
    quantised rows and scales, combined tokens bit for bit against torch;
    masked: numbers with the last rank masked (its experts' entries dropped), run last."""
    world, store = 4, tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(HERE / "buffer_ranks.py"), ",".join(SCENARIOS), str(r),
                               str(world),
                               str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}: {err[-3000:]}"
        for scenario in SCENARIOS:
            assert f"PASS {scenario}" in out, f"rank {r}: {err[-3000:]}"


@pytest.mark.parametrize("mode", [[], ["--low-latency"]], ids=["packed", "low-latency"])
def test_moe_layer_example_under_torchrun(mode, tmp_path):
    trace = tmp_path / "moe.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                        str(ROOT / "examples" / "python" / "moe_layer.py"), "--tokens", "24", "--hidden", "64",
                        "--experts", "8", "--topk", "2", "--trace", str(trace), *mode],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "moe_layer: OK" in p.stdout
    assert "step 1 combine: rank 0" in p.stdout and "slowest rank" in p.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "moe"]
    # two steps of dispatch and combine on each of 4 ranks, each with its stats
    assert sorted((e["pid"], e["name"]) for e in calls) == sorted(
        (r, f"{k} {s}") for r in range(4) for k in ("dispatch", "combine") for s in (1, 2))
    for e in calls:
        assert e["args"]["rank"] == e["pid"] and e["dur"] > 0
        if e["args"]["kind"] == "dispatch":
            assert e["args"]["bytes_sent"] == e["args"]["measured_remote_write"]
    assert any(e.get("ph") == "X" and e.get("tid", 0) < 999 for e in events), "no core spans"


def test_a_mismatch_fails_the_example(tmp_path):
    """The example's check can fail: with the experts' outputs scaled on one rank it reports the
    mismatch and exits non-zero."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(ROOT / "examples" / "python" / "moe_layer.py"), "--tokens", "8", "--hidden", "32",
                        "--experts", "4", "--topk", "2", "--steps", "1", "--break-rank", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode != 0
    assert "rank 1 step 0: mismatch against the single-process reference" in p.stderr
    assert "moe_layer: 2 mismatches" in p.stdout   # rank 1's experts serve both ranks' tokens
