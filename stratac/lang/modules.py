"""Modules: `import "PATH"` resolved to a file, and that file's schedules made callable.

In: a parsed file (ast.Module) and the Source it came from. Out: {schedule name: (its IR, its
syntax tree, the import that brought it)} for every schedule the file's imports define (what an
imported file imports itself is not passed on), or a StrataError at the import's file:line:col.

`import "NAME.strata"` looks in the importing file's directory (the working directory for source
text that is not a file), then in each directory of STRATAC_PATH (separated by os.pathsep), then
in the schedules shipped with stratac (the package's examples). `import "stratac:NAME"` names a
shipped file directly, as `comm.load("stratac:NAME")` does. Every module is read and lowered once
per top-level load; an import cycle, a missing module, a module with errors and two definitions of
one schedule name are errors of the import that causes them (E0110).
"""

from __future__ import annotations

import os
from pathlib import Path

from stratac import ir
from stratac.diagnostics import Codes, Note, Source, StrataError, check_source_name, error
from stratac.lang import ast, sema
from stratac.lang.syntax import parse
from stratac.resources import resource_dir

LIBRARY = "stratac:"


def library_dir() -> Path:
    """The schedules shipped with stratac: examples/ of a checkout, stratac/examples of a wheel."""
    return resource_dir("examples")


def library_path(name: str) -> Path | None:
    """`stratac:NAME` -> the shipped NAME.strata, or None when the name is not `stratac:...`."""
    if not name.startswith(LIBRARY):
        return None
    stem = name[len(LIBRARY):]
    return library_dir() / (stem if stem.endswith(".strata") else stem + ".strata")


def load_source(path: str | Path) -> Source:
    """The text of a .strata file; `stratac:NAME` names one shipped with stratac (lang.modules)."""
    shipped = library_path(str(path))
    if shipped is not None:
        if not shipped.is_file():
            have = ", ".join(sorted(f"stratac:{p.stem}" for p in library_dir().glob("*.strata")))
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


def _search(imp: ast.Import, importer: Source) -> tuple[Path | None, list[Path]]:
    """(the file an import names, or None; the directories looked in)."""
    shipped = library_path(imp.path)
    if shipped is not None:
        return (shipped if shipped.is_file() else None), [library_dir()]
    here = Path(importer.name).parent if Path(importer.name).is_file() else Path.cwd()
    dirs = [here] + [Path(d) for d in os.environ.get("STRATAC_PATH", "").split(os.pathsep) if d] \
        + [library_dir()]
    for d in dirs:
        if (d / imp.path).is_file():
            return (d / imp.path).resolve(), dirs
    return None, dirs


class Loader:
    """The modules of one top-level load (of `top`, a file or source text): each file lowered once,
    cycles refused."""

    def __init__(self, top: Source):
        self.done: dict[Path, dict[str, tuple[ir.Schedule, ast.Schedule]]] = {}
        self.active: list[Path] = [Path(top.name).resolve()] if Path(top.name).is_file() else []

    def imported(self, module: ast.Module, source: Source) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        mine = {s.name: s for s in module.schedules}
        for imp in module.imports:
            path, looked = _search(imp, source)
            if path is None:
                where = ", ".join(str(d) for d in looked)
                raise StrataError(error(Codes.IMPORT, f"no module {imp.path!r}: looked in {where} "
                                        "(the importing file's directory, STRATAC_PATH, the schedules "
                                        "shipped with stratac)", imp.span))
            if path in self.active:
                chain = " -> ".join(p.name for p in self.active[self.active.index(path):] + [path])
                raise StrataError(error(Codes.IMPORT, f"import cycle: {chain}", imp.span))
            for name, (s, tree) in self._load(path, imp).items():
                if name in mine:
                    raise StrataError(error(Codes.IMPORT, f"{imp.path} defines a schedule {name!r}, and "
                                            "so does this file: rename one", imp.span,
                                            Note("defined here", mine[name].name_span)))
                if name in out:
                    raise StrataError(error(Codes.IMPORT, f"{imp.path} defines a schedule {name!r}, and "
                                            f"so does {out[name][2].path}: import one of them", imp.span,
                                            Note("imported first here", out[name][2].span)))
                out[name] = (s, tree, imp)
        return out

    def _load(self, path: Path, imp: ast.Import) -> dict[str, tuple[ir.Schedule, ast.Schedule]]:
        if path not in self.done:
            self.active.append(path)
            try:
                source = load_source(path)
                module = parse(source)
                lowered = {s.name: s for s in sema.lower(module, self.imported(module, source))}
            except StrataError as exc:
                raise StrataError(list(exc.diagnostics) + [error(
                    Codes.IMPORT, f"{imp.path} has errors (above): nothing of it can be imported",
                    imp.span)]) from None
            finally:
                self.active.pop()
            self.done[path] = {t.name: (lowered[t.name], t) for t in module.schedules}
        return self.done[path]
