"""User names that are C++ keywords or names of the generated code (`class`, `sync`, `epoch`,
`x_` beside `x`, `T`, a schedule's own kernel name) are renamed in the generated code
(stratac/codegen/abi.py, c_name and c_param): schedules that use them build and run correctly on
the CPU model, and a kernel whose parameters are named after every identifier of the generated
code, of runtime/'s headers and of the macros those headers define builds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stratac import codegen
from stratac.codegen import abi
from stratac.diagnostics import Source
from stratac.ir import passes
from stratac.lang import frontend
from stratac.lang.sema import CALL_OPTIONS
from stratac.resources import resource_dir
from stratac.targets import cpu
from stratac.tools.run import runner

ROOT = Path(__file__).resolve().parents[2]
NAMES = Path(__file__).resolve().parent / "cpp_names.strata"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@pytest.mark.parametrize("world", [2, 3])
def test_schedules_named_like_cpp_run_correctly(world):
    cases = [runner.Case(dtype=dtype, count=count, root=root)
             for dtype, count, root in (("f32", 1, world - 1), ("i32", 1001, 0), ("bf16", 4099, 1))]
    spec = runner.RunSpec(file=str(NAMES), world=world, cases=cases, iters=1, warmup=0, cores=4,
                          timeout=60)
    out = runner.run(spec, echo=lambda line: None)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * 2
    assert [r for r in out.results if not r["ok"]] == []


def test_only_names_that_clash_are_renamed():
    kernels = {s.name: codegen.generate(passes.pipeline(s, passes.Options())).files["kernel.cpp"]
               for s in frontend.schedules(frontend.load_source(NAMES))}
    assert "class KernelT {" in kernels["t"]   # not the template's T
    assert "Init(GM_ADDR sync, int32_t epoch, GM_ADDR int_u, GM_ADDR sync_u, uint64_t epoch_u)" \
        in kernels["t"]
    assert "for (int64_t mv_u_ = 0; mv_u_ < world; ++mv_u_)" in kernels["t"]
    assert "Init(GM_ADDR sync, int32_t epoch, GM_ADDR x, GM_ADDR x_u1, uint64_t OP_u, int32_t this_u)" \
        in kernels["sync"]
    assert "x_ = reinterpret_cast<__gm__ T*>(x);" in kernels["sync"]


def _identifiers(text: str) -> set[str]:
    return set(IDENT.findall(re.sub(r"//[^\n]*|\"[^\"\n]*\"", "", text)))


def _candidates() -> list[str]:
    """Every identifier a user name could meet in C++, that the grammar accepts as a name."""
    found = set(abi.CPP_KEYWORDS)
    for path in sorted((ROOT / "examples").glob("*.strata")):
        for s in frontend.schedules(frontend.load_source(path)):
            files = codegen.generate(passes.pipeline(s, passes.Options())).files
            # a renamed user name as a member or local (`let T` is `T_u_`) is the user's, not a
            # name the generated code brings
            found |= {n for n in _identifiers(files["kernel.cpp"] + files["launch.cpp"])
                      if not re.fullmatch(r".*_u\d*_", n)}
    headers = sorted((resource_dir("runtime") / "device").glob("*.h")) + \
        sorted((resource_dir("runtime") / "cpu" / "include").glob("*.h"))
    for h in headers:
        found |= _identifiers(h.read_text())
    macros = subprocess.run(
        ["g++", "-std=c++17", "-DSTRATA_CPU_MODEL", f"-I{headers[0].parent}", f"-I{headers[-1].parent}",
         "-x", "c++", "-dM", "-E", "-"], input='#include "strata_device.h"\n', capture_output=True,
        text=True, check=True).stdout
    found |= set(re.findall(r"^#define (\w+)(?![\w(])", macros, re.MULTILINE))   # object-like macros
    found |= {n.rstrip("_") for n in found}   # the stems of members such as mv_
    grammar = (resource_dir("dsl") / "strata.lark").read_text()
    name = re.compile(re.search(r"^NAME: /(.*)/$", grammar, re.MULTILINE).group(1))
    return sorted(n for n in found if name.fullmatch(n) and n not in ("rank", "world"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_every_identifier_in_reach_is_a_name_that_builds():
    names = _candidates()
    assert {"class", "sync", "epoch", "GM_ADDR", "body", "mv", "M_PIf", "__gm__"} <= set(names)
    # a renamed name (x_u, x_u1) meets none of them, so a kernel of the names kept as written, and
    # of a few renamed ones, shows that every name builds
    assert [n for n in names if re.fullmatch(r".*_u\d*", n)] == []
    own = ["Everything", "everything_f32", "strata_launch_everything", "aclrtlaunch_everything_f32"]
    renamed = ["class", "sync", "epoch", "x_", "T", "GM_ADDR", "__gm__", "M_PIf", "mv", "body"]
    kept = [n for n in names if abi.c_name(n) == n and n not in own + renamed + sorted(CALL_OPTIONS)]
    # the AllReduce's tensor and its size, then a tensor and its size per pair of names kept as
    # written, and the rest as rank parameters
    a, b, *ranks = own + renamed
    pairs = list(zip(kept[0::2], kept[1::2]))
    ranks += kept[2 * len(pairs):]
    params = ", ".join([f"{a}: sym f32[{b}]"] + [f"{t}: f32[{z}]" for t, z in pairs]
                       + [f"{r}: rank" for r in ranks])
    text = f"schedule everything({params}) implements allreduce({a}, sum) {{\n  barrier\n}}\n"
    (s,) = frontend.schedules(Source("everything.strata", text))
    built = cpu.build_cpu(codegen.generate(passes.pipeline(s, passes.Options())))
    assert built.library.exists()
    assert [x["name"] for x in built.manifest["args"] if x["role"] in ("tensor", "rank")] == \
        [a] + [t for t, _ in pairs] + ranks   # the manifest and the Python API keep the user's names
