"""The machine a prediction is for. In: a machine file (machines/*.toml) and the world and cores a
request asks for. Out: a checked Machine (its figures per rank, each from the file) or one
SimulateError naming the file and key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stratac.ir import passes


class SimulateError(Exception):
    """A machine file or a request the model cannot use, said in one message (the CLI prints it,
    no traceback)."""


# section -> key -> kind: "name" (a non-empty string), "count" (an integer >= 1), "rate" (a number
# > 0), "time" (a number >= 0)
SCHEMA: dict[str, dict[str, str]] = {
    "machine": {"name": "name", "npus": "count", "dies_per_npu": "count"},
    "rank": {"vector_cores": "count", "ub_bytes_per_core": "count", "hbm_gbps": "rate",
             "fabric_gbps": "rate", "fabric_latency_us": "time"},
    "core": {"gm_to_ub_gbps": "rate", "ub_to_gm_gbps": "rate", "vector_gbps": "rate"},
    "sdma": {"queues": "count", "queue_gbps": "rate", "post_us": "time", "sqe_bytes": "count",
             "sqe_issue_us": "time"},
    "sync": {"launch_us": "time", "sync_all_us": "time", "flag_issue_us": "time"},
}

_KIND_TEXT = {"name": "a non-empty string", "count": "an integer >= 1",
              "rate": "a number > 0", "time": "a number >= 0"}


@dataclass(frozen=True)
class Machine:
    """The figures of a machine file, per rank (one die) unless said otherwise."""

    path: str
    name: str
    npus: int
    dies_per_npu: int
    vector_cores: int
    ub_bytes_per_core: int
    hbm_gbps: float
    fabric_gbps: float
    fabric_latency_us: float
    gm_to_ub_gbps: float
    ub_to_gm_gbps: float
    vector_gbps: float
    queues: int
    queue_gbps: float
    post_us: float          # the queue's cost per SQE (one SDMA descriptor)
    sqe_bytes: int          # a post is split into SQEs of at most this many bytes
    sqe_issue_us: float     # the issuing vector core's time per SQE it posts and per quiet
    launch_us: float
    sync_all_us: float
    flag_issue_us: float

    @property
    def max_world(self) -> int:
        return self.npus * self.dies_per_npu

    def figures(self) -> dict:
        return {sec: {k: getattr(self, k) for k in keys} for sec, keys in SCHEMA.items()}


def _toml():
    try:
        import tomllib
        return tomllib
    except ModuleNotFoundError:     # Python 3.10: the same parser as the tomli package
        try:
            import tomli
            return tomli
        except ModuleNotFoundError:
            raise SimulateError("reading a machine file needs Python >= 3.11 (tomllib) or the tomli "
                                "package on Python 3.10: pip install tomli") from None


def load_machine(path: str | Path) -> Machine:
    """Reads and checks a machine file; every problem is a SimulateError naming the file and key."""
    toml = _toml()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SimulateError(f"no such machine file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SimulateError(f"cannot read machine file {path}: {exc}") from None
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise SimulateError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SCHEMA))
    if unknown:
        raise SimulateError(f"{path}: unknown section [{unknown[0]}]; a machine file has "
                            f"{', '.join(f'[{s}]' for s in SCHEMA)}")
    values: dict[str, object] = {}
    for sec, keys in SCHEMA.items():
        table = data.get(sec)
        if table is None:
            raise SimulateError(f"{path}: missing section [{sec}] (keys: {', '.join(keys)})")
        if not isinstance(table, dict):
            raise SimulateError(f"{path}: [{sec}] must be a table of keys ({', '.join(keys)})")
        extra = sorted(set(table) - set(keys))
        if extra:
            raise SimulateError(f"{path}: unknown key {extra[0]!r} in [{sec}]; known: {', '.join(keys)}")
        for key, kind in keys.items():
            if key not in table:
                raise SimulateError(f"{path}: missing key {key!r} in [{sec}] ({_KIND_TEXT[kind]})")
            values[key] = _checked(table[key], kind, f"{path}: [{sec}] {key}")
    m = Machine(path=str(path), **values)
    if m.ub_bytes_per_core < passes.UB_BYTES:
        raise SimulateError(f"{path}: [rank] ub_bytes_per_core = {m.ub_bytes_per_core}, but the "
                            f"kernels lay out {passes.UB_BYTES} bytes of UB per core")
    return m


def _checked(v, kind: str, where: str):
    ok = {"name": isinstance(v, str) and v.strip() != "",
          "count": isinstance(v, int) and not isinstance(v, bool) and v >= 1,
          "rate": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
          "time": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
          }[kind]
    if not ok:
        raise SimulateError(f"{where} must be {_KIND_TEXT[kind]}, got {v!r}")
    return float(v) if kind in ("rate", "time") else v


def check_world(m: Machine, world: int) -> None:
    if world < 1:
        raise SimulateError(f"--world must be at least 1, got {world}")
    if world > m.max_world:
        raise SimulateError(f"world {world} is larger than the machine in {m.path}: {m.npus} NPUs x "
                            f"{m.dies_per_npu} dies = {m.max_world} ranks")


def check_cores(m: Machine, cores: int | None) -> int:
    """The vector cores per rank a request models: all of the machine's unless it asks for fewer."""
    if cores is None:
        return m.vector_cores
    if not 1 <= cores <= m.vector_cores:
        raise SimulateError(f"--cores must be between 1 and {m.vector_cores} (the vector cores of a "
                            f"rank in {m.path}), got {cores}")
    return cores
