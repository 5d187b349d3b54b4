"""Modules: `import "PATH"` and `stratac:NAME` (stratac.lang.modules). A file's own schedules call
imported ones; the search order (the file's directory, STRATAC_PATH, the shipped schedules); and
every way an import goes wrong is one E0110 at the import's file:line:col, never a traceback."""

from __future__ import annotations

import pytest

from stratac import cli, verify
from stratac.diagnostics import Codes, StrataError
from stratac.lang import frontend

RING = """
schedule ring(x: sym T[n], op: redop) implements allreduce(x, op) {
  flag ready[1]
  flag got[2 * world]
  part = split(x, world)
  let next = (rank + 1) % world
  signal ready[0]@((rank - 1) % world)
  wait ready[0]
  for s in 0 .. 2 * world - 2 {
    let c = (rank - s) % world
    if s > 0: wait got[s - 1]
    if s < world - 1 { on aiv: part[c]@next op= part[c] } else { on sdma: part[c]@next = part[c] }
    signal got[s]@next
  }
  if world > 1: wait got[2 * world - 3]
}
"""

CALLER = """import "{module}"

schedule twice(x: sym T[n], op: redop) implements allreduce(x, op) {{
  barrier
  call {callee}(x, op) on world
  barrier
}}
"""


def errors_of(path) -> list:
    with pytest.raises(StrataError) as exc:
        frontend.schedules(frontend.load_source(path))
    return list(exc.value.diagnostics)


def test_an_imported_schedule_is_called_and_only_the_files_own_are_compiled(tmp_path):
    (tmp_path / "ring.strata").write_text(RING)
    (tmp_path / "main.strata").write_text(CALLER.format(module="ring.strata", callee="ring"))
    s, = frontend.schedules(frontend.load_source(tmp_path / "main.strata"))
    assert s.name == "twice" and [c.callee for c in s.calls] == ["ring"]
    assert all(r.ok for r in verify.verify_worlds(s, [1, 2, 3, 4]))


def test_the_search_order_is_the_files_directory_then_stratac_path_then_the_shipped_ones(tmp_path,
                                                                                         monkeypatch):
    lib, other = tmp_path / "lib", tmp_path / "other"
    lib.mkdir()
    other.mkdir()
    (lib / "ring.strata").write_text(RING)
    (other / "main.strata").write_text(CALLER.format(module="ring.strata", callee="ring"))
    d, = errors_of(other / "main.strata")
    assert d.code == Codes.IMPORT and (d.span.line, d.span.col) == (1, 1)
    assert d.message.startswith("no module 'ring.strata': looked in ")
    monkeypatch.setenv("STRATAC_PATH", str(lib))
    assert [s.name for s in frontend.schedules(frontend.load_source(other / "main.strata"))] == ["twice"]
    # a shipped file by its name alone (no file of that name here), and by `stratac:NAME`
    for module in ("allreduce_ring.strata", "stratac:allreduce_ring"):
        (other / "shipped.strata").write_text(CALLER.format(module=module, callee="allreduce_ring"))
        s, = frontend.schedules(frontend.load_source(other / "shipped.strata"))
        assert s.calls[0].callee == "allreduce_ring"


def test_stratac_names_a_shipped_file_for_load_and_the_cli(capsys):
    s, = frontend.schedules(frontend.path_or_text("stratac:allreduce_ring"))
    assert s.name == "allreduce_ring"
    with pytest.raises(StrataError) as exc:
        frontend.path_or_text("stratac:no_such_schedule")
    d, = exc.value.diagnostics
    assert d.code == Codes.IMPORT and "stratac:allreduce_ring" in d.message, d.message
    assert cli.main(["check", "stratac:allreduce_ring", "--world", "2"]) == 0
    assert cli.main(["check", "stratac:no_such_schedule", "--world", "2"]) != 0
    assert "error[E0110]: no schedule file stratac:no_such_schedule is shipped" in capsys.readouterr().err


def test_a_cycle_a_clash_and_a_module_with_errors_are_errors_of_the_import(tmp_path):
    (tmp_path / "a.strata").write_text('import "b.strata"\n' + RING.replace("ring", "ring_a"))
    (tmp_path / "b.strata").write_text('import "a.strata"\n' + RING.replace("ring", "ring_b"))
    d, *_ = errors_of(tmp_path / "a.strata")
    assert d.code == Codes.IMPORT and d.message == "import cycle: a.strata -> b.strata -> a.strata"
    assert d.span.source.name.endswith("b.strata") and d.span.line == 1

    (tmp_path / "ring.strata").write_text(RING)
    (tmp_path / "ring2.strata").write_text(RING)
    (tmp_path / "own.strata").write_text('import "ring.strata"\n' + RING)
    d, = errors_of(tmp_path / "own.strata")
    assert d.code == Codes.IMPORT and d.message == ("ring.strata defines a schedule 'ring', and so does "
                                                    "this file: rename one") and d.notes[0].span.line == 3
    (tmp_path / "two.strata").write_text('import "ring.strata"\nimport "ring2.strata"\n'
                                         + CALLER.format(module="ring.strata", callee="ring"))
    d, = errors_of(tmp_path / "two.strata")
    assert d.code == Codes.IMPORT and d.span.line == 2 and "and so does ring.strata" in d.message

    (tmp_path / "bad.strata").write_text(RING.replace("wait ready[0]", "wait nothing[0]"))
    (tmp_path / "uses_bad.strata").write_text(CALLER.format(module="bad.strata", callee="ring"))
    *inner, d = errors_of(tmp_path / "uses_bad.strata")
    assert inner and inner[0].span.source.name.endswith("bad.strata")
    assert d.code == Codes.IMPORT and d.message == "bad.strata has errors (above): nothing of it can be imported"
    assert d.span.source.name.endswith("uses_bad.strata") and d.span.line == 1


def test_an_unknown_callee_names_the_imported_schedules(tmp_path):
    (tmp_path / "ring.strata").write_text(RING)
    (tmp_path / "main.strata").write_text(CALLER.format(module="ring.strata", callee="rnig"))
    d, = errors_of(tmp_path / "main.strata")
    assert d.code == Codes.CALL and "no schedule 'rnig' in this file or its imports (schedules: ring)" in d.message
