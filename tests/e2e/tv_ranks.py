"""One rank of the translation validation (test_translation.py): `python tv_ranks.py JOB RANK STORE`.

The job is a list of parts, each a world and its plan (tvkit.Plan). For each part in turn, the
ranks below its world make a communicator over a group of the first `world` ranks, load every
compiled schedule of the plan once, then run every instance in turn on that communicator: allocates
its tensors on the heap, fills every buffer (the scratch too)
with this rank's numbered tags, calls the schedule through the public API (its checks and the
proof of the call's instance included), and compares every buffer with the verifier's simulated
memory. Writes one JSON line per instance to the part's `rankR.jsonl`: `ok`, or each buffer that
differs (its first wrong index, the value expected and the value got, how many elements are wrong),
or the error the call raised. Beside them `rankR.started` and `rankR.done`, and an error outside
the instances (the communicator, loading) in `rankR.error`, after which the rank ends the job (the
other ranks may be in a collective with it). Rank 0 writes the seconds a part took to `seconds`.
"""

import json
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tvkit  # noqa: E402

from stratac.host.comm import Communicator  # noqa: E402
from stratac.host.errors import StrataRuntimeError, StrataUsageError  # noqa: E402
from stratac.host.schedule import Module  # noqa: E402

TIMEOUT = 20.0   # a kernel wait that never comes (a broken kernel) ends the job, not the test run


def numbers(t, inst):
    """t as the instance's numbers are written into it and read back: its values, or a float16
    tensor's bit patterns (tvkit.F16_PATTERNS)."""
    return t.view(torch.int16) if inst.bits and t.dtype == torch.float16 else t


def one(comm, rank, fn, inst):
    """Runs one instance on this rank; (the call's error or None, the buffers that differ)."""
    s = fn.ir
    tensors = {}
    for p in s.tensors:
        t = comm.empty(*inst.shapes[p.name], dtype=getattr(torch, inst.dtypes[p.name]))
        numbers(t.view(-1), inst).copy_(torch.from_numpy(inst.init[rank][p.name]))
        tensors[p.name] = t
    # the type a type variable runs as (tvkit.typevar_dtype), which scratch buffers of it hold
    ir = tvkit.ir
    tv = next((d for p in s.params if p.typevar for d in ir.DType if d.torch_name == inst.dtypes[p.name]),
              ir.DType.F32)
    env = {"world": comm.world, **inst.sizes, **ir.elem_env(s, tv.nbytes),
           **{x.name: inst.scalars[x.name] for x in s.int_params}}   # scratch sizes may name them
    scratch = dict(zip((p.name for p in s.scratch), fn._scratch_for(tv, env)))
    for name, t in scratch.items():
        numbers(t.view(-1)[:inst.init[rank][name].size], inst).copy_(torch.from_numpy(inst.init[rank][name]))
    if inst.active is not None and not all(inst.active):
        # a masked rank's fill must come before any write, so that a kernel writing to it is seen
        comm.barrier()
    # else no barrier: a kernel writes to another rank only after the call's agreement, which that
    # rank enters after its fill above (strata::Agree), so a write before it (a broken agreement)
    # would be undone by the fill and seen; the barrier after the call keeps this instance's writes
    # from the next instance's fills
    error = None
    if inst.active is None or inst.active[rank]:   # a masked rank does not call
        try:
            fn(**tensors, **inst.scalars,
               **({"active": list(inst.active)} if inst.active is not None else {}))
            if inst.overflow:
                error = "the call did not report the window's bound exceeded"
        except StrataRuntimeError as exc:
            if not (inst.overflow and "more than the" in str(exc)):
                error = f"{type(exc).__name__}: {exc}"
        except StrataUsageError as exc:
            error = f"{type(exc).__name__}: {exc}"
    else:
        # the live ranks' calls took stamps from their communicators' epochs; a masked rank is
        # meant to stay out for good (docs/robustness.md), but here it takes part in the next
        # instance, so its epoch moves on as theirs did (comm.next_call, as a call does)
        params = {**inst.sizes, **{x.name: inst.scalars[x.name] for x in s.int_params}}
        comm.next_call(s.stamps({"world": comm.world, **params}))
    comm.barrier()   # every kernel of the instance is done
    wrong = []
    for name, want in inst.expect[rank].items():
        t = tensors[name] if name in tensors else scratch[name].view(-1)[:want.size]
        got = numbers(t.reshape(-1), inst).to(torch.float64).numpy()   # exact: every number is below 2^24
        bad = np.nonzero(got != want.astype(np.float64))[0]
        if bad.size:
            i = int(bad[0])
            wrong.append({"buffer": name, "index": i, "expected": want[i].item(), "got": got[i].item(),
                          "count": int(bad.size), "scratch": name in scratch})
    for t in reversed(list(tensors.values())):
        comm.free(t)
    return error, wrong


def run(plan, rank, comm, out):
    mods = [Module(comm, compiled, selection=False) for _, compiled in plan.files]
    for m in mods:
        comm._modules.append(m)   # unloaded by comm.close, as comm.load's are
    for k, inst in enumerate(plan.instances):
        try:
            error, wrong = one(comm, rank, mods[inst.file][inst.schedule], inst)
        except (StrataRuntimeError, StrataUsageError) as exc:   # allocating, filling, freeing
            error, wrong = f"{type(exc).__name__}: {exc}", []
        out.write(json.dumps({"k": k, "error": error, "wrong": wrong}) + "\n")
        out.flush()
        if error and "failed on rank" in error:
            return   # the pool is aborted: nothing more can run
    for m in mods:
        for fn in m.schedules.values():
            fn.release_scratch()


def main(job_path, rank, store):
    torch.set_num_threads(1)
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    size = max(part["world"] for part in job)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=120))
    for part in job:
        group = dist.new_group(ranks=list(range(part["world"])))   # every rank takes part in this
        out_dir = Path(part["out"])
        t0 = time.perf_counter()
        if rank < part["world"]:
            (out_dir / f"rank{rank}.started").touch()
            try:
                plan = tvkit.read(Path(part["plan"]))
                comm = Communicator.from_process_group(heap_bytes=64 << 20, timeout=TIMEOUT, group=group)
                try:
                    with open(out_dir / f"rank{rank}.jsonl", "w") as out:
                        run(plan, rank, comm, out)
                finally:
                    comm.close()
            except Exception:
                # the test reports it as this rank's failure in this part; the other ranks may be
                # in a collective with this one, so the job ends here (they fail as its peer goes)
                (out_dir / f"rank{rank}.error").write_text(traceback.format_exc()[-4000:])
                sys.stdout.flush()
                os._exit(1)
            (out_dir / f"rank{rank}.done").touch()
        dist.barrier()   # the next part starts on every rank together
        if rank == 0:
            (out_dir / "seconds").write_text(f"{time.perf_counter() - t0:.3f}")
    dist.destroy_process_group()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
