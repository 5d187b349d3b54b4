"""The verifier's compiled evaluation of IR expressions (stratac.ir.instantiate._Py): a
subexpression written several times (a substituted let) is computed once, and only where it would
always be evaluated; the values and the errors are the IR's own (ir.Bin.eval)."""

import pytest

from stratac import ir
from stratac.ir import instantiate
from stratac.ir.expr import Bin, Const, Sel, Var
from stratac.ir.expr import BinKind as K

n, k, w = Var("n"), Var("k"), Var("world")
DIV = Bin(K.DIV, n, k)
GUARDED = Sel(Bin(K.GT, k, Const(0)), DIV, Const(0))      # (n / k if k > 0 else 0)
S = Sel(Bin(K.EQ, w, Const(1)), Const(0), Bin(K.ADD, Bin(K.LOG2, Bin(K.SUB, w, Const(1)), Const(0)),
                                                  Const(1)))   # ceil(log2(world))


@pytest.mark.parametrize("e", [
    Bin(K.ADD, GUARDED, GUARDED),
    Bin(K.MUL, Bin(K.ADD, S, S), Bin(K.LT, n, S)),
    Sel(Bin(K.LT, S, n), Bin(K.SHL, Const(1), S), Bin(K.MOD, S, Bin(K.ADD, k, Const(1)))),
])
@pytest.mark.parametrize("env", [{"n": 7, "k": 0, "world": 1}, {"n": 7, "k": 3, "world": 6},
                                 {"n": 1, "k": 2, "world": 9}])
def test_common_subexpressions_keep_the_value(e, env):
    assert instantiate._compiled(e)(dict(env)) == e.eval(env)


def test_a_repeated_let_is_computed_once():
    e = Bin(K.MUL, Bin(K.ADD, S, S), Bin(K.LT, n, S))
    src = instantiate._Py([e])(e)
    assert src.count("_log2") == 1 and src.count(":=") == 1, src


def test_a_subexpression_under_a_branch_is_not_computed_outside_it():
    """n / k only under `k > 0` twice: at k = 0 neither runs. Once more outside any branch: that
    one runs, and divides by zero, as the IR does."""
    assert instantiate._compiled(Bin(K.ADD, GUARDED, GUARDED))({"n": 5, "k": 0}) == 0
    src = instantiate._Py([Bin(K.ADD, GUARDED, GUARDED)])(Bin(K.ADD, GUARDED, GUARDED))
    assert ":= _div" not in src, src
    both = Bin(K.ADD, GUARDED, DIV)
    with pytest.raises(ZeroDivisionError):
        instantiate._compiled(both)({"n": 5, "k": 0})
    assert instantiate._compiled(both)({"n": 6, "k": 3}) == 4


def test_a_region_evaluates_its_parts_with_shared_terms():
    part = ir.split_part(n, w, Bin(K.MOD, Bin(K.SUB, Var("rank"), Var("s")), w))
    r = ir.Region("x", part[0], part[1], None, None)
    fn = instantiate._region_fn(r)
    env = {"n": 10, "world": 4, "rank": 1, "s": 3}
    owner, lo, length = fn(env)[:3]
    assert (owner, lo, length) == (1, part[0].eval(env), part[1].eval(env)) == (1, 6, 2)
