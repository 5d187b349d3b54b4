"""Diagnostics as data: severity, code, message, span, notes. Only the CLI prints them.

Rendering follows rustc: ``file:line:col: error[CODE]: message`` then the source line and a caret
under the span, then the notes, each with its own location when it has one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """A source text and the name it is reported under."""

    name: str
    text: str

    def __post_init__(self):
        # A UTF-8 byte order mark (Windows editors write one) is an encoding mark, not text: dropped
        # here, where every source is made (files and the API's strings), it never reaches the
        # parser, and line 1's columns stay those an editor shows, which hides the mark.
        if self.text.startswith("\ufeff"):
            object.__setattr__(self, "text", self.text[1:])

    @staticmethod
    def from_path(path: str | Path) -> "Source":
        p = Path(path)
        return Source(str(path), p.read_text(encoding="utf-8"))

    def line(self, lineno: int) -> str:
        lines = self.text.split("\n")   # as lark counts lines (splitlines also breaks at \f, ...)
        return lines[lineno - 1].rstrip("\r") if 0 < lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """A region of a source: 1-based line and column of its start, and its end (exclusive col)."""

    source: Source
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.col}"

    def __repr__(self) -> str:  # keeps IR dumps short
        return f"Span({self})"


class Severity(enum.Enum):
    ERROR = "error"      # stratac has no warnings: what it reports stops the compile
    NOTE = "note"


@dataclass(frozen=True)
class Note:
    message: str
    span: Span | None = None


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    code: str
    message: str
    span: Span | None = None
    notes: tuple[Note, ...] = field(default_factory=tuple)

    def render(self) -> str:
        head = f"{self.severity.value}[{self.code}]: {self.message}"
        out = [f"{self.span}: {head}" if self.span else head]
        if self.span:
            out.extend(_excerpt(self.span))
        for note in self.notes:
            if note.span:
                out.append(f"  note: {note.span}: {note.message}")
                out.extend(_excerpt(note.span))
            else:
                out.append(f"  note: {note.message}")
        return "\n".join(out)


def _excerpt(span: Span) -> list[str]:
    text = span.source.line(span.line)
    if not text:
        return []
    width = (span.end_col - span.col) if span.end_line == span.line else len(text) - span.col + 1
    gutter = f"{span.line:>4} | "
    return [gutter + text, " " * (len(gutter) + span.col - 1) + "^" * max(1, width)]


class StrataError(Exception):
    """Raised by any stage with one or more diagnostics; the CLI renders and exits."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


def error(code: str, message: str, span: Span | None = None, *notes: Note) -> Diagnostic:
    return Diagnostic(Severity.ERROR, code, message, span, tuple(notes))


class Codes:
    """Every diagnostic code in one place, so the language reference can list them (dsl/README.md;
    tests/test_coverage_table.py checks that a test provokes each through the real entry point)."""

    SYNTAX = "E0001"
    UNKNOWN_NAME = "E0101"
    DUPLICATE_NAME = "E0102"
    BAD_TYPE = "E0103"
    BAD_CONTRACT = "E0104"
    BAD_ENGINE = "E0105"
    BAD_REF = "E0106"
    BAD_SIZE = "E0107"
    NOT_SYMMETRIC = "E0108"
    CALL = "E0109"
    IMPORT = "E0110"
    BAD_WORLD = "E0201"
    SHAPE = "E0202"
    RACE = "E0301"
    DEADLOCK = "E0302"
    # E0303 (an access before the peer entered the call) is retired: every call begins with the
    # agreement of the live ranks, a barrier, so no statement can run before a peer entered
    EXIT = "E0304"
    CONTRACT = "E0305"
    DOUBLE_SIGNAL = "E0306"
    SYNC_STAMP = "E0307"
    BUILD = "E0401"
    TOOLCHAIN = "E0402"
    OUTPUT = "E0403"


def check_source_name(name: str) -> None:
    """A source name ends up in comments of the generated C++ and CMake files: a line break there
    would turn the rest of the name into code. Refused (file names with spaces, quotes or shell
    characters are fine: nothing reaches a shell)."""
    bad = next((ch for ch in name if ord(ch) < 32 or ord(ch) == 127), None)
    if bad is not None:
        raise StrataError(error(Codes.SYNTAX, f"the source name {name!r} contains the control character "
                                f"{bad!r}; rename the file (it would be written into generated code)"))
