"""The package's imports follow the data flow: every import of a stratac module points to the same
stage or one below it, and no modules import each other in a cycle (function-level imports count
too: a lazy import is still a dependency). docs/architecture.md explains the order."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "stratac"

# bottom to top: a module may import its own stage and the stages before it
STAGES = [
    ("stratac.diagnostics", "stratac.resources"),    # the ground every stage stands on
    ("stratac.ir",),                                 # the schedule IR, instantiate, passes
    ("stratac.lang",),                               # .strata text -> IR
    ("stratac.verify",),                             # IR instances -> proof or diagnostics
    ("stratac.codegen",),                            # IR after the passes -> sources
    ("stratac.targets",),                            # sources -> built libraries (cpu, npu)
    ("stratac.host",),                               # built libraries -> Python callables
    ("stratac.distributed", "stratac.deep_ep"),      # torch.distributed's backend, DeepEP's Buffer
    ("stratac.tools",),                              # run, bench, simulate, doctor
    ("stratac.cli", "stratac.__main__", "stratac"),  # the command line and the package's front
]


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The stratac modules `name` imports, anywhere in the file."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("stratac"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_pkg else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("stratac"):
                continue
            for a in node.names:   # `from stratac.x import y`: y may be a module of its own
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m in known and m != name}


def stage(name: str) -> int:
    best = None
    for i, prefixes in enumerate(STAGES):
        for p in prefixes:
            if name == p or name.startswith(p + ".") and p != "stratac":
                best = i
    assert best is not None, f"{name} is in no stage: add it to STAGES and docs/architecture.md"
    return best


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_module_has_a_stage():
    for m in modules():
        stage(m)


def test_imports_point_down_the_data_flow():
    upward = [f"{m} (stage {stage(m)}) imports {d} (stage {stage(d)})"
              for m, deps in graph().items() for d in sorted(deps)
              if stage(d) > stage(m) and m != "stratac"]
    assert not upward, "imports that climb the data flow:\n" + "\n".join(upward)


def test_no_import_cycles():
    g = graph()
    g["stratac"] = set()   # the package front only re-exports, lazily: every `stratac.x` passes it
    state, cycles = {}, []

    def visit(m, path):
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_says_what_comes_in_and_goes_out(name):
    doc = ast.get_docstring(ast.parse(modules()[name].read_text()))
    assert doc and len(doc) > 40, f"{name} has no module docstring"


def test_the_graph_is_read_right():
    """The reader of the graph itself, on modules whose imports are known by hand."""
    g = graph()
    assert "stratac.ir.nodes" in g["stratac.ir"]                 # the package re-exports its nodes
    assert "stratac.lang.sema" in g["stratac.lang.frontend"]      # `from stratac.lang import sema`
    assert "stratac.ir" in g["stratac.lang.sema"]                 # `from stratac import ir`
    assert "stratac.tools.run.runner" in g["stratac.cli"]         # a function-level import
    assert stage("stratac.tools.bench.sweep") > stage("stratac.host.comm") > stage("stratac.ir.passes")
