"""The mutation list of tests/mutants.py stays in step with the source and the suite (issue 16).

The mutation runs themselves are slow and run on demand (`python tests/mutants.py`); this only
checks, on every suite run, what would otherwise let the list rot silently: each mutation's old
text occurs exactly once in its file (else the mutant would mutate nothing, or the wrong place) and
changes it, and every node id it lists is collected by pytest (else "caught" would rest on a test
that no longer exists).
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stratac_mutants", ROOT / "tests" / "mutants.py")
mutants = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutants   # dataclasses look their module up there
_spec.loader.exec_module(mutants)


def test_names_are_unique_and_every_mutation_lists_tests():
    names = [m.name for m in mutants.MUTATIONS]
    assert len(names) == len(set(names))
    for m in mutants.MUTATIONS:
        assert m.tests, m.name
        for _file, old, new in m.edits():
            assert old != new, m.name


@pytest.mark.parametrize("m", mutants.MUTATIONS, ids=lambda m: m.name)
def test_old_text_occurs_exactly_once(m):
    for file, old, _new in m.edits():
        text = (ROOT / file).read_text()
        assert text.count(old) == 1, f"{m.name}: {file} has the old text {text.count(old)} times"


def test_apply_refuses_text_that_is_not_there(tmp_path):
    """The refusal the list relies on, shown: a mutation whose text is missing or doubled."""
    m = mutants.MUTATIONS[0]
    f = tmp_path / m.file
    f.parent.mkdir(parents=True)
    f.write_text("nothing to mutate here\n")
    with pytest.raises(mutants.ListError, match="0 times"):
        mutants.apply(m, tmp_path)
    f.write_text(m.old + m.old)
    with pytest.raises(mutants.ListError, match="2 times"):
        mutants.apply(m, tmp_path)
    f.write_text("a\n" + m.old + "b\n")
    mutants.apply(m, tmp_path)
    assert f.read_text() == "a\n" + m.new + "b\n"


def test_every_listed_node_id_is_collected():
    ids = sorted({t for m in mutants.MUTATIONS for t in m.tests})
    files = sorted({t.split("::")[0] for t in ids})
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *files], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    collected = {line.strip() for line in p.stdout.splitlines() if "::" in line}
    missing = [t for t in ids if t not in collected]
    assert not missing, f"listed in tests/mutants.py but not collected: {missing}\n{p.stdout[-2000:]}"


def test_apply_makes_every_edit_of_a_mutation_or_none(tmp_path):
    """A mutation of several files changes each of them; if one edit's text is missing nothing
    is written (a half-applied mutant would test a bug nobody would write)."""
    m = mutants.Mutation("two-files", "a.txt", "x = 1", "x = 2", ("t",), "why",
                         more=(("b/c.txt", "y = 1", "y = 2"),))
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("x = 1\n")
    (tmp_path / "b" / "c.txt").write_text("y = 3\n")
    with pytest.raises(mutants.ListError, match="0 times in b/c.txt"):
        mutants.apply(m, tmp_path)
    assert (tmp_path / "a.txt").read_text() == "x = 1\n"
    (tmp_path / "b" / "c.txt").write_text("y = 1\n")
    mutants.apply(m, tmp_path)
    assert (tmp_path / "a.txt").read_text() == "x = 2\n"
    assert (tmp_path / "b" / "c.txt").read_text() == "y = 2\n"
