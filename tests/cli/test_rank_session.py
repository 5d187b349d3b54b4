"""The runner's ranks (stratac.tools.run.procs, forked from a server that imported torch) each lead
a process group of their own (so that the runner can kill what a rank started) but stay in the
runner's session: with autogroup scheduling every session is a scheduling group, and a rank's
sched_yield could not hand the CPU to a peer of another session (docs/bench.md, "4 KiB on 4 ranks:
waiting when ranks outnumber CPUs"). mpirun's ranks share its session in the same way. And a forked
rank is the process `python SCRIPT` or `python -m MODULE` would have been: its argv, environment,
working directory, exit status, atexit handlers, a traceback for an uncaught exception."""
import os
import signal
import sys

from stratac.tools.run import procs

PROBE = """
import atexit, os, sys, json
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "argv": sys.argv,
                  "env": os.environ.get("PROBE_VALUE"), "cwd": os.getcwd(), "name": __name__}))
mode = sys.argv[1]
if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise ValueError("probe failed on purpose")
if mode == "sigint":
    raise KeyboardInterrupt
"""


def _run(tmp_path, mode):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out, err = open(tmp_path / f"{mode}.out", "w+"), open(tmp_path / f"{mode}.err", "w+")
    env = dict(os.environ, PROBE_VALUE=f"value-{mode}")
    rank = procs.Rank([str(script), mode], out, err, env, cwd=str(tmp_path))
    code = rank.wait(timeout=120)
    out.seek(0)
    err.seek(0)
    return rank, code, out.read().splitlines(), err.read()


def test_a_rank_shares_the_runner_session_in_a_group_of_its_own(tmp_path):
    import json
    rank, code, lines, err = _run(tmp_path, "ok")
    assert code == 0, err
    got = json.loads(lines[0])
    assert got["pid"] == rank.pid
    assert got["pgid"] == got["pid"], "the rank leads a process group of its own (killpg reaches it alone)"
    assert got["pgid"] != os.getpgid(0)
    assert got["sid"] == os.getsid(0), "the rank is in the runner's session (one scheduling group)"
    assert got["argv"] == [str(tmp_path / "probe.py"), "ok"]
    assert got["env"] == "value-ok" and got["cwd"] == str(tmp_path) and got["name"] == "__main__"
    assert lines[1:] == ["atexit ran"]


def test_a_rank_ends_as_the_interpreter_would(tmp_path):
    _, code, lines, err = _run(tmp_path, "exit3")
    assert code == 3 and lines[-1] == "atexit ran"
    _, code, _, err = _run(tmp_path, "raise")
    assert code == 1
    assert "Traceback (most recent call last)" in err and "ValueError: probe failed on purpose" in err
    _, code, _, err = _run(tmp_path, "sigint")
    assert code == -signal.SIGINT and "KeyboardInterrupt" in err


def test_a_module_runs_as_python_m(tmp_path):
    out, err = open(tmp_path / "m.out", "w+"), open(tmp_path / "m.err", "w+")
    rank = procs.Rank(["-m", "json.tool", "--compact"], out, err, dict(os.environ))
    # json.tool reads stdin, which is /dev/null for a rank: no input, an error, status 1
    code = rank.wait(timeout=120)
    err.seek(0)
    assert code == 1 and "Expecting value" in err.read(), sys.executable
