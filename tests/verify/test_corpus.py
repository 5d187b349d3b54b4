"""The corpus of wrong (and a few right) schedules: one file per mistake class.

tests/frontend/corpus/ holds syntax and semantic errors, tests/verify/corpus/ verifier errors and
the good files. The convention is described in tests/README.md: a file may start with
`# worlds: 2,3,4` (or ranges, `1-8`; default 1-8) and marks every error it must produce on the line
where the error's primary span starts, with `# expect-error[CODE]: substring of the message`.
A file without markers must verify cleanly for all its worlds.

One parametrized test runs the whole pipeline over every file: the front end, then
verify.verify_worlds for every schedule; the errors it gets (all front-end errors, or the first
failing verification of each schedule) must be exactly the marked ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratac import verify
from stratac.diagnostics import Diagnostic, Severity, StrataError
from stratac.lang import frontend

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
CORPORA = [TESTS / "frontend" / "corpus", TESTS / "verify" / "corpus"]
FILES = sorted(p for d in CORPORA for p in d.glob("*.strata"))

# several markers may share a line (several errors start there): each runs to the next one
MARKER = re.compile(r"#\s*expect-error\[(?P<code>[A-Z]\d{4})\]:\s*(?P<text>.*?)\s*(?=#\s*expect-error|$)")
WORLDS = re.compile(r"#\s*worlds:\s*(?P<spec>[\d,\s-]+?)\s*$")
DEFAULT_WORLDS = list(range(1, 9))


@dataclass(frozen=True)
class Expected:
    line: int
    code: str
    text: str

    def matches(self, d: Diagnostic) -> bool:
        return (d.span is not None and d.span.line == self.line and d.code == self.code
                and self.text in d.message)

    def __str__(self) -> str:
        return f"line {self.line}: error[{self.code}] containing {self.text!r}"


def parse_worlds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def read_expectations(path: Path) -> tuple[list[int], list[Expected]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    worlds = DEFAULT_WORLDS
    if lines and (m := WORLDS.match(lines[0])):
        worlds = parse_worlds(m["spec"])
    expected = [Expected(i, m["code"], m["text"]) for i, text in enumerate(lines, start=1)
                for m in MARKER.finditer(text)]
    return worlds, expected


def errors_of(path: Path, worlds: list[int]) -> list[Diagnostic]:
    """Front end, then the verifier on every schedule; the error diagnostics that come out."""
    source = frontend.load_source(str(path.relative_to(ROOT)))
    try:
        schedules = frontend.schedules(source)
    except StrataError as exc:
        return [d for d in exc.diagnostics if d.severity is Severity.ERROR]
    out: list[Diagnostic] = []
    for s in schedules:
        failed = [r for r in verify.verify_worlds(s, worlds) if not r.ok]
        if failed:
            out.extend(d for d in failed[0].diagnostics if d.severity is Severity.ERROR)
    return out


def test_corpus_is_not_empty():
    assert len([f for f in FILES if "frontend" in f.parts]) >= 30
    assert len([f for f in FILES if "verify" in f.parts]) >= 20


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_corpus_file(path: Path, monkeypatch):
    monkeypatch.chdir(ROOT)
    worlds, expected = read_expectations(path)
    errors = errors_of(path, worlds)
    shown = "\n".join(d.render() for d in errors) or "(no errors)"
    if not expected:
        assert not errors, f"{path.name} should verify cleanly for worlds {worlds}, got:\n{shown}"
        return

    first = errors[0] if errors else None
    assert first is not None, f"expected {expected[0]}, but the file verified cleanly"
    assert first.span is not None, shown
    assert any(e.matches(first) for e in expected), \
        f"the first error matches no marker\nmarkers: {[str(e) for e in expected]}\ngot:\n{shown}"

    # exactly the marked errors: every error matches a distinct marker and every marker is used
    unmatched = list(expected)
    for d in errors:
        hit = next((e for e in unmatched if e.matches(d)), None)
        assert hit is not None, f"unexpected error (not marked):\n{d.render()}\nall errors:\n{shown}"
        unmatched.remove(hit)
    assert not unmatched, f"marked but not reported: {[str(e) for e in unmatched]}\ngot:\n{shown}"

    # rendering: rustc-style header, the source line with a caret under the span
    rel = str(path.relative_to(ROOT))
    for d in errors:
        text = d.render()
        head = f"{rel}:{d.span.line}:{d.span.col}: error[{d.code}]: "
        assert text.startswith(head), text
        lines = text.split("\n")
        assert lines[1].startswith(f"{d.span.line:>4} | "), text
        caret = lines[2]
        assert set(caret.strip()) == {"^"}, text
        assert len(caret) - len(caret.lstrip()) == len(f"{d.span.line:>4} | ") + d.span.col - 1, text
