"""Source text to verified-ready IR: parse, then semantic checks and lowering."""

from __future__ import annotations

from pathlib import Path

from stratac import ir
from stratac.diagnostics import Source
from stratac.lang import modules, sema
from stratac.lang.modules import load_source
from stratac.lang.syntax import parse


def path_or_text(path_or_source: str | Path, name: str = "<source>") -> Source:
    """What `comm.load` takes: a path (a Path, or a one-line string ending in .strata) or the text
    of a .strata file, named `name` in diagnostics."""
    if isinstance(path_or_source, Path) or (isinstance(path_or_source, str)
                                            and (path_or_source.endswith(".strata")
                                                 or path_or_source.startswith(modules.LIBRARY))
                                            and "\n" not in path_or_source):
        return load_source(path_or_source)
    return Source(name, str(path_or_source))


def schedules(source: Source) -> list[ir.Schedule]:
    """The file's own schedules as IR (those of its imports are only there to be called)."""
    module = parse(source)
    return sema.lower(module, modules.Loader(source).imported(module, source) if module.imports else None)
