"""Integer arrays in the IR and the kernel: `var t[K] = v` is an int64_t array with room for
ir.ARRAY_CAPACITY whose first K elements are filled, `set t[i] = v` and a read t[i] are subscripts
printed by ir.c_source (the index as the IR has it), and the IR printer shows both forms. The
values they compute on the CPU build are checked against torch in tests/e2e/test_arrays_run.py."""

import pytest

from stratac import codegen, ir
from stratac.diagnostics import Source
from stratac.ir import passes
from stratac.lang import frontend

from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "verify" / "corpus" / "good_array_tables.strata"


def _schedule(name: str) -> ir.Schedule:
    ss = frontend.schedules(frontend.load_source(str(FILE)))
    return passes.pipeline(next(s for s in ss if s.name == name), passes.Options())


def test_the_kernel_declares_fills_sets_and_reads_an_array():
    k = codegen.generate(_schedule("allreduce_hd_tables")).files["kernel.cpp"]
    assert f"int64_t peer_[{ir.ARRAY_CAPACITY}];" in k and f"int64_t keep_[{ir.ARRAY_CAPACITY}];" in k
    assert "for (int64_t j = 0; j < L_; ++j) {\n      peer_[j] = 0;\n    }" in k, k
    assert "peer_[k_] = p_;" in k and "keep_[k_] = lo_;" in k
    assert "const int64_t a_ = keep_[k_];" in k
    # the element read as the rank a copy writes to and a signal goes to
    assert "mv_.Copy(strata::Via::kSdma, x_ + lo + off, peer_[k_]," in k
    assert "epoch_ + 1, peer_[k_]);" in k


def test_an_element_read_under_a_move_loop_is_indexed_by_the_loop_variable():
    k = codegen.generate(_schedule("allgather_by_table")).files["kernel.cpp"]
    assert "order_[i_] = strata::Mod(rank + world - i_, world);" in k, k
    assert "order_[i_]" in k.split("strata::Partition")[1], k


def test_a_loop_over_peers_skips_the_running_rank_and_a_negative_local_is_floored():
    """The kernel's loop over the peers around a `set` skips the running rank, as the proof's
    does; a let that reads an element (a local: it may be negative) is floored by strata::Mod,
    where C++'s % would truncate."""
    k = codegen.generate(_schedule("allgather_peer_table")).files["kernel.cpp"]
    assert "for (int64_t p_ = 0; p_ < world; ++p_) {  // strata:60\n      if (p_ == rank) continue;\n" \
        "      back_[p_] = p_ - rank - world;" in k, k
    assert "strata::Mod(rank + b_, world)" in k and "(rank + b_) % world" not in k


def test_the_ir_printer_shows_arrays():
    text = ir.dump(_schedule("allreduce_hd_tables"))
    assert "var peer[L] = 0" in text or "var peer[log2(world)] = 0" in text, text
    assert "set peer[k] = " in text and "set keep[k] = lo" in text, text


@pytest.mark.parametrize("e, text", [
    (ir.Elem("t", ir.Var("a")), "t_[a]"),
    (ir.Elem("t", ir.Bin(ir.BinKind.MOD, ir.Bin(ir.BinKind.ADD, ir.Var("a"), ir.Const(1)), ir.Var("b"))),
     "t_[(a + 1) % b]"),
    (ir.Bin(ir.BinKind.MUL, ir.Elem("t", ir.Const(0)), ir.Bin(ir.BinKind.ADD, ir.Var("a"), ir.Const(2))),
     "t_[0] * (a + 2)"),
])
def test_c_source_of_an_element(e, text):
    assert ir.c_source(e, {"t": "t_", "a": "a", "b": "b"}) == text


def test_an_element_outside_its_array_is_an_error_naming_it():
    env = {"t": (5, 6, 7), "i": 3}
    assert ir.Elem("t", ir.Const(2)).eval(env) == 7
    for i in (3, -1):
        with pytest.raises(IndexError, match=rf"t\[{i}\] is outside t's 3 elements \(0 \.\. 2\)"):
            ir.Elem("t", ir.Const(i)).eval(env)
