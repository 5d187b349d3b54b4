"""Source text to verified-ready IR: parse, then semantic checks and lowering."""

from __future__ import annotations

from pathlib import Path

from stratac import ir
from stratac.diagnostics import Codes, Source, StrataError, check_source_name, error
from stratac.lang import sema
from stratac.lang.syntax import parse


def load_source(path: str | Path) -> Source:
    check_source_name(str(path))   # the name is written into generated files: no line breaks
    try:
        return Source.from_path(path)
    except FileNotFoundError:
        raise StrataError(error(Codes.SYNTAX, f"no such file: {path}")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StrataError(error(Codes.SYNTAX, f"cannot read {path}: {exc}")) from None


def schedules(source: Source) -> list[ir.Schedule]:
    return sema.lower(parse(source))
