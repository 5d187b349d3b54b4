"""`stratac run` in process for the end-to-end tests (tests/e2e): one spec, quiet, warmup 0; and
`concat`, several .strata files as one."""

import re
from pathlib import Path

from stratac.tools.run import runner

IMPORT = re.compile(r'^import\s+"([^"]+)"[^\n]*\n?', re.M)


def concat(paths) -> str:
    """The files' text as one file: their imports first, once each, but an import of one of the
    files themselves (its schedules are in the text already; importing it too would define them
    twice). An import left resolves as in its own file only if it names a shipped schedule file
    (`stratac:NAME`, or a name the examples hold), which the search falls back on."""
    paths = [Path(p) for p in paths]
    here = {p.name for p in paths} | {f"stratac:{p.stem}" for p in paths}
    imports, bodies = [], []
    for p in paths:
        text = p.read_text()
        imports += [m.group(1) for m in IMPORT.finditer(text) if m.group(1) not in here]
        bodies.append(IMPORT.sub("", text))
    head = "".join(f'import "{m}"\n' for m in dict.fromkeys(imports))
    return head + "\n".join(bodies)


def run(path, world: int, cases, *, iters: int = 2, cores: int = 4, timeout: float = 60, **kw):
    """runner.run of `path` (a file, or a list of files run in one job) on `world` ranks; its
    RunOutcome (nothing printed)."""
    files = [str(p) for p in path] if isinstance(path, (list, tuple)) else str(path)
    spec = runner.RunSpec(file=files, world=world, cases=cases, iters=iters, warmup=0, cores=cores,
                          timeout=timeout, **kw)
    return runner.run(spec, echo=lambda line: None)
