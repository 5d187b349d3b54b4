"""The verifier's verdicts on the instances calls run, cached beside the builds.

In: a schedule's IR (after the passes: what the kernel is generated from), a world size, the
parameters of one call's instance (sizes, rank parameters) and a function that proves it. Out: a
`Verdict` (what was proven, what proving it cost), read from the cache or proven now and stored.

A verdict is one file, $STRATAC_CACHE_DIR/verdicts/<schedule>-<key>.json, keyed by the IR's full
text, the digest of stratac's own code (so a changed verifier proves again), the world and the
parameters. Only successful proofs are stored. The file is written to a temporary name and renamed
under a per-key lock, so ranks that start the same instance at once prove it once; it records the
fields of its key and a sha256 over its content, and is trusted only when it is this user's own
regular file, not writable by group or others, and every field and the checksum match: anything
else is proven again and replaced, never believed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stratac import ir
from stratac.resources import compiler_digest
from stratac.targets.cpu import CacheLock, cache_root, owned_privately


@dataclass(frozen=True)
class Verdict:
    proof: dict        # what the verifier checked (the prover's record: sizes, routings)
    seconds: float     # what proving it cost when it was proven
    cached: bool       # read from the disk cache rather than proven by this call


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fields(s: ir.Schedule, world: int, params: dict[str, int]) -> dict:
    # repr of the frozen IR is its complete text (every node, expression, stamp and plan)
    return {"schedule": s.name, "ir": _digest(repr(s)), "stratac": compiler_digest(),
            "world": world, "params": {k: int(v) for k, v in sorted(params.items())}}


def _checksum(fields: dict, proof: dict, seconds: float) -> str:
    return _digest(json.dumps([fields, proof, seconds], sort_keys=True))


def _read(path: Path, fields: dict) -> Verdict | None:
    """The verdict stored at path if it is intact, this user's own and about exactly `fields`."""
    if not owned_privately(path, False):
        return None
    try:
        data = json.loads(path.read_text())
        proof, seconds = data["proof"], data["seconds"]
        if (data["fields"] != fields or not isinstance(proof, dict)
                or data["sha256"] != _checksum(fields, proof, seconds)):
            return None
        return Verdict(proof, float(seconds), True)
    except (ValueError, KeyError, TypeError, OSError):
        return None


def _write(path: Path, fields: dict, verdict: Verdict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.tmp.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"fields": fields, "proof": verdict.proof, "seconds": verdict.seconds,
                       "sha256": _checksum(fields, verdict.proof, verdict.seconds)}, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def verdict_path(s: ir.Schedule, world: int, params: dict[str, int]) -> Path:
    """Where the verdict on this instance is stored."""
    return _path(s.name, _fields(s, world, params))


def _path(name: str, fields: dict) -> Path:
    key = _digest(json.dumps(fields, sort_keys=True))[:32]
    return cache_root() / "verdicts" / f"{name}-{key}.json"


def verdict(s: ir.Schedule, world: int, params: dict[str, int], prove: Callable[[], dict]) -> Verdict:
    """The verdict on the instance (s, world, params): from the cache, or prove() (which raises when
    the instance is not proven; nothing is stored then) timed and stored."""
    fields = _fields(s, world, params)   # the IR's text is hashed once per instance
    path = _path(s.name, fields)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if not owned_privately(path.parent, True):
        # someone else's directory: nothing in it is believed, and nothing is left in it
        return _proven(prove)
    found = _read(path, fields)
    if found is not None:
        return found
    with CacheLock(path.with_suffix(".lock")):
        found = _read(path, fields)   # another rank proved it while this one waited
        if found is not None:
            return found
        v = _proven(prove)
        _write(path, fields, v)
        return v


def _proven(prove: Callable[[], dict]) -> Verdict:
    t0 = time.perf_counter()
    proof = prove()
    return Verdict(proof, round(time.perf_counter() - t0, 6), False)
