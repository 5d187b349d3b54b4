"""Synchronisation: flag declarations, `signal f[i]@p`, `wait f[i]`, and barriers (of the world or
of a team).

In: ast.FlagDecl, ast.Signal, ast.Wait and ast.Barrier, with the loop variables around them and
whether they sit in a stage. Out: the flags recorded in the scope, ir.Signal, ir.Wait and
ir.Barrier (or None after a diagnostic); a barrier's step loops must run as often on every rank.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes, Note
from stratac.lang import ast
from stratac.lang.sema.scope import Scope


class Sync(Scope):
    def flag_decl(self, st: ast.FlagDecl, top: bool) -> None:
        if not top:
            self.err(Codes.BAD_REF, "flags are declared at the top of a schedule", st.span)
            return
        if self.taken(st.name):
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.span)
            return
        reported = len(self.diags)
        rounds = ir.Const(1) if st.rounds is None else ir.simplify(self.expr(
            st.rounds, self.static_env(), f"the rounds of flag {st.name}"))
        if len(self.diags) > reported:   # said at the rounds: declared with one, for its uses
            rounds = ir.Const(1)
        if isinstance(rounds, ir.Const) and rounds.value < 1:
            self.err(Codes.BAD_REF, f"flag {st.name} has {rounds.value} rounds: a slot is signalled "
                     "at least once per call (rounds 1, the default, or more)", st.span)
            return
        self.flags[st.name] = ir.Flag(st.name, self.expr(st.size, self.static_env(),
                                                        f"the size of flag {st.name}"), st.span,
                                      rounds=rounds)

    def barrier(self, st: ast.Barrier, loop_vars, in_stage: bool):
        if in_stage or any(v not in self.step_vars for v in loop_vars):
            self.err(Codes.BAD_ENGINE, "a barrier is a statement of its own, outside stages and "
                     "loops over ranks (it may sit in a step loop, `for s in lo .. hi`)", st.span)
            return None
        # every rank must advance its epoch by the same stamps per call, so the loops around
        # a barrier run as often on every rank: their bounds may not depend on rank
        fixed = self.fixed_names()
        for lo, hi, span in self.loop_bounds:
            bad = (lo.names() | hi.names()) - fixed
            if bad:
                self.err(Codes.BAD_REF, f"a barrier in a step loop whose bounds depend on "
                         f"{', '.join(sorted(bad))}: every rank passes a call's barriers the same "
                         "number of times, so the bounds of the loops around a barrier are "
                         "expressions of world, sizes and rank parameters", st.span,
                         Note("the loop", span))
                return None
        if st.team is not None:
            team = self.team_of(st.team, st.team_span)
            return None if team is None else ir.Barrier(st.span, team=team)
        return ir.Barrier(st.span)

    def sync(self, st, loop_vars, in_stage):
        kind = "signal" if isinstance(st, ast.Signal) else "wait"
        if in_stage:
            self.err(Codes.BAD_ENGINE, f"{kind} is a statement of its own, outside stages: flags "
                     "travel after the stage's data is complete", st.span)
            return None
        ref = st.ref
        if ref.name not in self.flags:
            self.err(Codes.UNKNOWN_NAME, f"{ref.name!r} is not a flag (declare it: flag {ref.name}[world])",
                     ref.name_span)
            return None
        if not isinstance(ref.selector, ast.Index) or ref.sub is not None:
            self.err(Codes.BAD_REF, f"pick one slot of flag {ref.name}: {ref.name}[i]", ref.span)
            return None
        env = self.env(loop_vars)
        index = self.expr(ref.selector.index, env, "a flag index")
        rnd = ir.Const(0) if st.round is None else self.expr(st.round, env, "a flag round")
        if st.round is not None and self.flags[ref.name].rounds == ir.Const(1):
            self.err(Codes.BAD_REF, f"flag {ref.name} has one round per call: declare its rounds "
                     f"to signal a slot again (flag {ref.name}[...] rounds R)", st.span,
                     Note(f"{ref.name} is declared here", self.flags[ref.name].span))
            return None
        if isinstance(st, ast.Signal):
            if ref.rank is None:
                self.err(Codes.BAD_REF, f"say whose flag is set: signal {ref.name}[i]@p", ref.span)
                return None
            return ir.Signal(ref.name, index, self.expr(ref.rank, env, "a rank"), st.span, rnd)
        if ref.rank is not None:
            self.err(Codes.BAD_REF, "a rank waits on its own flags only: drop the @", ref.span)
            return None
        return ir.Wait(ref.name, index, st.span, rnd)
