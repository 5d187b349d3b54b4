"""Source text to verified-ready IR: parse, then semantic checks and lowering."""

from __future__ import annotations

from pathlib import Path

from stratac import ir
from stratac.diagnostics import Codes, Source, StrataError, check_source_name, error
from stratac.lang import modules, sema
from stratac.lang.syntax import parse


def load_source(path: str | Path) -> Source:
    """The text of a .strata file; `stratac:NAME` names one shipped with stratac (lang.modules)."""
    shipped = modules.library_path(str(path))
    if shipped is not None:
        if not shipped.is_file():
            have = ", ".join(sorted(f"stratac:{p.stem}" for p in modules.library_dir().glob("*.strata")))
            raise StrataError(error(Codes.IMPORT, f"no schedule file {path} is shipped with stratac "
                                    f"(shipped: {have})"))
        path = shipped
    check_source_name(str(path))   # the name is written into generated files: no line breaks
    try:
        return Source.from_path(path)
    except FileNotFoundError:
        raise StrataError(error(Codes.SYNTAX, f"no such file: {path}")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StrataError(error(Codes.SYNTAX, f"cannot read {path}: {exc}")) from None


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
