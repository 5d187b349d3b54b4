"""A let in the kernel (codegen.emit, ir.Local.inline): the IR substitutes it, the kernel declares
it where it stands and prints its name where an expression in its scope holds its value; a
declaration nothing came to use is dropped, and so is a let only such a declaration used."""

import re

from stratac import codegen
from stratac.diagnostics import Source
from stratac.ir import passes
from stratac.lang import frontend

SRC = """
schedule lets(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  let b = rank * n                        # used by the copy below: declared
  let lone = world * 7 + 3                # used by nobody: dropped
  let a = (rank + 5) % world              # used only by the unused let c: dropped with it
  let c = a * a + world
  blk = split(out, world)
  barrier
  for s in 0 .. 2 {
    let w = (s + 1) * world               # in scope inside the loop only
    if w > world: barrier
    if w > 2 * world: barrier
  }
  on sdma: for p in ranks: out[b:b + n]@p = x
  barrier
}
"""


def kernel() -> str:
    s = passes.pipeline(frontend.schedules(Source("lets.strata", SRC))[0], passes.Options())
    return codegen.generate(s).files["kernel.cpp"]


def test_a_let_is_declared_and_named_where_it_is_used():
    k = kernel()
    assert re.search(r"const int64_t b_ = rank \* n_;", k), k
    assert "out_ + b_" in k and "rank * n_ +" not in k.split("const int64_t b_")[1], k
    assert "const int64_t w_ = (s_ + 1) * world;" in k
    assert "if (w_ > world)" in k and "if (w_ > 2 * world)" in k


def test_unused_lets_and_the_lets_only_they_used_are_dropped():
    k = kernel()
    for name in ("lone_", "a_", "c_"):
        assert f"int64_t {name} =" not in k, k
