"""Helpers of the fault tests: rank processes of tests/faults/ranks.py, /dev/shm and process
snapshots (nothing may be left behind). Test modules import it as `faultkit` (this folder is put
on sys.path by conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def segment_path(name: str) -> Path:
    """Where Linux keeps the POSIX shared-memory segment `name` (e.g. /stratac-1000-ab12...)."""
    return Path("/dev/shm") / name.lstrip("/")


def mapped_segments(pids) -> set[str]:
    """The stratac pools these processes map (from /proc/PID/maps; a name that is already unlinked
    is listed with " (deleted)"), as segment names: this test's own segments, never another job's."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 5)   # address, perms, offset, device, inode[, path]
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/dev/shm/stratac-"):
                names.add("/" + path[len("/dev/shm/"):].removesuffix(" (deleted)"))
    return names


def leftover_segments(names) -> set[str]:
    """Those of `names` (segments this test's own jobs made) still in /dev/shm. Segments of other
    jobs on the machine are not looked at, so they cannot make a test fail or pass."""
    return {n for n in names if segment_path(n).exists()}


def descendants(pid: int) -> list[int]:
    """Live (or zombie) processes below pid, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                text = f.read()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def processes_matching(text: str) -> list[int]:
    """Processes whose command line contains text."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(int(d))
    return found


@dataclass
class Rank:
    proc: subprocess.Popen
    out: str = ""
    err: str = ""
    lines: list[str] = field(default_factory=list)

    def first(self, tag: str) -> str | None:
        """The rest of the first line that starts with tag ("" if the line is just the tag)."""
        return next((ln[len(tag) + 1:] for ln in self.lines if ln == tag or ln.startswith(tag + " ")), None)


class Ranks:
    """The processes of one scenario of ranks.py; stdout is read line by line as it comes."""

    def __init__(self, scenario: str, world: int, tmp: Path, timeout: float, arg: str = ""):
        self.tmp = tmp
        self.ranks: list[Rank] = []
        for r in range(world):
            out = open(tmp / f"rank{r}.out", "w")
            err = open(tmp / f"rank{r}.err", "w")
            p = subprocess.Popen([sys.executable, str(HERE / "ranks.py"), scenario, str(r), str(world),
                                  str(tmp / "store"), str(timeout), arg],
                                 stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
            out.close()
            err.close()
            self.ranks.append(Rank(p))

    def segments(self) -> list[str]:
        """The segment of each scenario, as rank 0 announced it (SEGMENT lines)."""
        self.read()
        return [ln.split()[2] for ln in self.ranks[0].lines if ln.startswith("SEGMENT ")]

    def read(self) -> None:
        for r, rk in enumerate(self.ranks):
            rk.out = (self.tmp / f"rank{r}.out").read_text()
            rk.err = (self.tmp / f"rank{r}.err").read_text()
            rk.lines = rk.out.splitlines()

    def wait_for(self, tag: str, ranks, limit: float = 120) -> None:
        """Until every rank in `ranks` printed a line starting with tag."""
        deadline = time.monotonic() + limit
        while True:
            self.read()
            if all(self.ranks[r].first(tag) is not None for r in ranks):
                return
            dead = [r for r in ranks if self.ranks[r].proc.poll() is not None]
            if dead:
                raise AssertionError(f"rank {dead[0]} ended before printing {tag}:\n"
                                     f"{self.ranks[dead[0]].out}\n{self.ranks[dead[0]].err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {tag} from ranks {list(ranks)} within {limit} s")
            time.sleep(0.02)

    def wait(self, limit: float = 180) -> None:
        deadline = time.monotonic() + limit
        for rk in self.ranks:
            try:
                rk.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"ranks still running after {limit} s") from None
        self.read()

    def kill(self) -> None:
        for rk in self.ranks:
            if rk.proc.poll() is None:
                rk.proc.send_signal(signal.SIGKILL)
        for rk in self.ranks:
            rk.proc.wait()


