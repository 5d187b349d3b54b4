"""The A2/A3 (910B/910C) dtype tables of the vector APIs and of Cast are compile errors in the CPU
model, as they are for bisheng: a tiny kernel breaking one rule fails to build with g++ against
runtime/cpu/include, with a message naming the op, the types and the doc page; the same kernel with
the rule kept builds (so a broken harness cannot pass). Sources: asc-devkit docs (Add.md, Div.md,
Duplicate.md, Cast.md; runtime/README.md's rule table)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "runtime" / "cpu" / "include"
DEVICE = REPO / "runtime" / "device"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

KERNEL = """
#include "kernel_operator.h"
using namespace AscendC;
extern "C" __global__ __aicore__ void k(GM_ADDR) {
  TPipe pipe;
  TBuf<> b;
  pipe.InitBuffer(b, 8192);
  LocalTensor<float> f = b.Get<float>();
  LocalTensor<half> h = b.GetWithOffset<half>(256, 2048);
  LocalTensor<bfloat16_t> bf = b.GetWithOffset<bfloat16_t>(256, 4096);
  LocalTensor<int32_t> i = b.GetWithOffset<int32_t>(256, 6144);
  LocalTensor<int8_t> i8 = b.GetWithOffset<int8_t>(256, 7168);
  (void)f; (void)h; (void)bf; (void)i; (void)i8;
  %s;
}
"""

# rule: (the call that breaks it, pieces of g++'s message, the same call keeping the rule)
CASES = {
    "add_bf16": ("Add(bf, bf, bf, 64)",
                 ["AscendC::Add on A2/A3 has no bfloat16_t form: it takes int16_t, half, int32_t, float only "
                  "(asc-devkit docs Add.md)"],
                 "Add(h, h, h, 64)"),
    "max_bf16": ("Max(bf, bf, bf, 64)", ["AscendC::Max on A2/A3 has no bfloat16_t form", "Max.md"],
                 "Max(f, f, f, 64)"),
    "min_bf16": ("Min(bf, bf, bf, 64)", ["AscendC::Min on A2/A3 has no bfloat16_t form", "Min.md"],
                 "Min(i, i, i, 64)"),
    "muls_bf16": ("Muls(bf, bf, bfloat16_t(2.0f), 64)", ["AscendC::Muls on A2/A3 has no bfloat16_t form"],
                  "Muls(f, f, 2.0f, 64)"),
    "adds_uint32": ("Adds(i.ReinterpretCast<uint32_t>(), i.ReinterpretCast<uint32_t>(), 1u, 64)",
                    ["AscendC::Adds on A2/A3 takes int16_t, half, int32_t, float only (asc-devkit docs Adds.md)"],
                    "Adds(i, i, 1, 64)"),
    "div_int32": ("Div(i, i, i, 64)", ["AscendC::Div on A2/A3 takes half, float only (asc-devkit docs Div.md)"],
                  "Div(f, f, f, 64)"),
    "duplicate_int8": ("Duplicate(i.ReinterpretCast<int8_t>(), int8_t(1), 64)",
                       ["AscendC::Duplicate on A2/A3 takes int16_t, uint16_t, half, bfloat16_t, int32_t, "
                        "uint32_t, float only (asc-devkit docs Duplicate.md)"],
                       "Duplicate(bf, bfloat16_t(1.0f), 64)"),
    "cast_f32_bf16_none": ("Cast(bf, f, RoundMode::CAST_NONE, 64)",
                           ["AscendC::Cast float->bfloat16_t on A2/A3 takes CAST_RINT/CAST_FLOOR/CAST_CEIL/"
                            "CAST_ROUND/CAST_TRUNC only (asc-devkit docs Cast.md)"],
                           "Cast(bf, f, RoundMode::CAST_RINT, 64)"),
    "cast_f32_bf16_odd": ("Cast(bf, f, RoundMode::CAST_ODD, 64)",
                          ["AscendC::Cast float->bfloat16_t on A2/A3 takes CAST_RINT/"],
                          "Cast(bf, f, RoundMode::CAST_TRUNC, 64)"),
    "cast_half_f32_rint": ("Cast(f, h, RoundMode::CAST_RINT, 64)",
                           ["AscendC::Cast half->float on A2/A3 takes CAST_NONE only (asc-devkit docs Cast.md)"],
                           "Cast(f, h, RoundMode::CAST_NONE, 64)"),
    "cast_bf16_f32_rint": ("Cast(f, bf, RoundMode::CAST_RINT, 64)",
                           ["AscendC::Cast bfloat16_t->float on A2/A3 takes CAST_NONE only"],
                           "Cast(f, bf, RoundMode::CAST_NONE, 64)"),
    "cast_f32_i32_none": ("Cast(i, f, RoundMode::CAST_NONE, 64)",
                          ["AscendC::Cast float->int32_t on A2/A3 takes CAST_RINT/"],
                          "Cast(i, f, RoundMode::CAST_ROUND, 64)"),
    "cast_bf16_half": ("Cast(h, bf, RoundMode::CAST_NONE, 64)",
                       ["AscendC::Cast between bfloat16_t and half: A2/A3 have no direct conversion "
                        "(asc-devkit docs Cast.md)"],
                       "Cast(f, bf, RoundMode::CAST_NONE, 64)"),
    "cast_half_bf16": ("Cast(bf, h, RoundMode::CAST_RINT, 64)",
                       ["AscendC::Cast between bfloat16_t and half"],
                       "Cast(bf, f, RoundMode::CAST_RINT, 64)"),
    "cast_i32_half": ("Cast(h, i, RoundMode::CAST_NONE, 64)",
                      ["AscendC::Cast int32_t->half on A2/A3 needs SetDeqScale (asc-devkit docs Cast.md)"],
                      "Cast(f, i, RoundMode::CAST_NONE, 64)"),
    # int8: only int8_t->half (CAST_NONE) and half->int8_t (NONE/RINT/FLOOR/CEIL/ROUND/TRUNC) are in
    # the A2/A3 table; float<->int8_t goes through half (audit 2 #28)
    "cast_f32_i8": ("Cast(i8, f, RoundMode::CAST_RINT, 64)",
                    ["AscendC::Cast: this (src, dst) pair is not in the A2/A3 table", "float<->int8_t goes through half"],
                    "Cast(i8, h, RoundMode::CAST_RINT, 64)"),
    "cast_i8_f32": ("Cast(f, i8, RoundMode::CAST_NONE, 64)",
                    ["AscendC::Cast: this (src, dst) pair is not in the A2/A3 table"],
                    "Cast(h, i8, RoundMode::CAST_NONE, 64)"),
    "cast_i8_half_rint": ("Cast(h, i8, RoundMode::CAST_RINT, 64)",
                          ["AscendC::Cast int8_t->half on A2/A3 takes CAST_NONE only (asc-devkit docs Cast.md)"],
                          "Cast(h, i8, RoundMode::CAST_NONE, 64)"),
    "cast_half_i8_odd": ("Cast(i8, h, RoundMode::CAST_ODD, 64)",
                         ["AscendC::Cast half->int8_t on A2/A3 takes CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/"
                          "CAST_ROUND/CAST_TRUNC only"],
                         "Cast(i8, h, RoundMode::CAST_TRUNC, 64)"),
    "cast_half_half": ("Cast(h, h, RoundMode::CAST_NONE, 64)",
                       ["AscendC::Cast: this (src, dst) pair is not in the A2/A3 table (asc-devkit docs Cast.md)"],
                       "Cast(h, f, RoundMode::CAST_ODD, 64)"),
}


def _build(tmp_path: Path, call: str) -> subprocess.CompletedProcess:
    src = tmp_path / "k.cpp"
    src.write_text(KERNEL % call)
    # as stratac builds a kernel (targets/cpu.py: -std=c++17 -O2), to an object file
    return subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-c", str(src),
                           f"-I{INCLUDE}", "-o", str(tmp_path / "k.o")], capture_output=True, text=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_a2_a3_type_rule_is_a_compile_error(tmp_path, name):
    bad, pieces, good = CASES[name]
    run = _build(tmp_path, bad)
    assert run.returncode != 0, f"{bad} compiled"
    for piece in pieces:
        assert piece in run.stderr, run.stderr[:3000]
    ok = _build(tmp_path, good)
    assert ok.returncode == 0, ok.stderr[:3000]


def test_the_old_bf16_fold_no_longer_compiles(tmp_path):
    """The device library's reduction as it was (Add/Max/Min on bfloat16_t tiles, audit §0.1) is
    what the model now refuses; the library as it is builds for every dtype."""
    src = tmp_path / "fold.cpp"
    src.write_text("""
#include "strata_device.h"
template <typename T> void Fold(AscendC::LocalTensor<T>& acc, AscendC::LocalTensor<T>& in) {
  AscendC::Add(acc, acc, in, 64);
}
template void Fold<bfloat16_t>(AscendC::LocalTensor<bfloat16_t>&, AscendC::LocalTensor<bfloat16_t>&);
template <typename T> void Reduce(strata::Mover<T>& mv, T* p) {
  mv.template Fold<strata::Red::kSum>(p, 64, true);
  mv.template Fold<strata::Red::kSum>(p, 64, false);
  mv.template Fold<strata::Red::kMax>(p, 64, false);
  mv.template Fold<strata::Red::kMin>(p, 64, false);
  mv.Store(p, 64);
}
template void Reduce<bfloat16_t>(strata::Mover<bfloat16_t>&, bfloat16_t*);
template void Reduce<half>(strata::Mover<half>&, half*);
template void Reduce<float>(strata::Mover<float>&, float*);
template void Reduce<int32_t>(strata::Mover<int32_t>&, int32_t*);
""")
    cmd = ["g++", "-std=c++17", "-O2", "-c", "-DSTRATA_CPU_MODEL", f"-I{INCLUDE}", f"-I{DEVICE}",
           str(src), "-o", str(tmp_path / "fold.o")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode != 0
    assert "AscendC::Add on A2/A3 has no bfloat16_t form" in run.stderr
    # the library's reductions (Fold of every op, Store, every dtype) raise nothing of their own
    assert run.stderr.count("error") == 1 and "void Fold(" in run.stderr, run.stderr[:3000]
