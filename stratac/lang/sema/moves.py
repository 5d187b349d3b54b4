"""Data movement and stages: copies, reductions (`op(x@p for p in ranks)` over ranks or a team's
members, `op(a, b, ...)` of named regions), reduce on write (`+=`), and the stages that run them (`on aiv|sdma|auto:`, asynchronous
`on sdma async h:` and its `await h`).

In: ast.Stage, ast.Await, ast.Assign (a copy or a reduction) and ast.Accum, with the loop
variables around them and the engine of the enclosing stage. Out: ir.Stage, ir.Await, ir.Copy,
ir.Reduce, ir.ReduceList and ir.Accumulate (or None after a diagnostic); what each engine can do (SDMA neither
computes nor copies between two remote sides) is checked here.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes
from stratac.lang import ast
from stratac.lang.sema.scope import Scope


class Moves(Scope):
    def stage(self, st: ast.Stage, loop_vars, in_stage: bool):
        if in_stage:
            self.err(Codes.BAD_ENGINE, "stages do not nest", st.span)
            return None
        if any(v not in self.step_vars for v in loop_vars):
            self.err(Codes.BAD_ENGINE, "put the loop inside the stage: `on ENGINE: for ...` (stages "
                     "may sit in step loops, `for s in lo .. hi`)", st.span)
            return None
        if st.handle is not None and not self.post(st, in_stage):
            return None
        eng = ir.Engine(st.engine)
        body = self.block(st.body, top=False, loop_vars=loop_vars, engine=eng)
        self.stage_count += 1
        return ir.Stage(eng, tuple(body), st.span, self.stage_count, handle=st.handle)

    def post(self, st: ast.Stage, in_stage: bool) -> bool:
        """Checks an asynchronous stage `on sdma async h:` and opens its handle; False on an error."""
        if st.engine != "sdma":
            self.err(Codes.BAD_ENGINE, f"only `on sdma` stages can be asynchronous (`on {st.engine}` "
                     "copies run on the vector cores, which finish them before going on)", st.span)
            if not in_stage:
                self.pending[-1].setdefault(st.handle, st.handle_span)   # its await is no error
            return False
        if in_stage:
            return True   # reported as a nested stage
        if any(st.handle in block for block in self.pending) or self.taken(st.handle):
            self.err(Codes.DUPLICATE_NAME, f"{st.handle!r} is already in flight or names something "
                     "else: await it first or pick another name", st.handle_span)
            return False
        self.pending[-1][st.handle] = st.handle_span
        return True

    def await_(self, st: ast.Await, in_stage: bool):
        if in_stage:
            self.err(Codes.BAD_ENGINE, "await is a statement of its own, outside stages", st.span)
            return None
        if st.handle in self.pending[-1]:
            del self.pending[-1][st.handle]
            return ir.Await(st.handle, st.span)
        if any(st.handle in block for block in self.pending):
            self.err(Codes.BAD_REF, f"await {st.handle} in the block that posted it (so that every "
                     "path through the block completes it once)", st.handle_span)
        else:
            self.err(Codes.UNKNOWN_NAME, f"{st.handle!r} is not an asynchronous stage in flight here "
                     f"(post one first: `on sdma async {st.handle}: ...`)", st.handle_span)
        return None

    def move(self, st: ast.Assign, loop_vars, engine: ir.Engine):
        dst = self.region(st.target, loop_vars, "destination")
        if isinstance(st.value, ast.ReduceCall):
            rc = st.value
            if engine is ir.Engine.SDMA:
                self.err(Codes.BAD_ENGINE, "SDMA cannot compute: reductions run `on aiv`", rc.span)
                return None
            if rc.var in loop_vars or self.taken(rc.var) or rc.var in self.sizes:
                self.err(Codes.DUPLICATE_NAME, f"{rc.var!r} shadows another name", rc.span)
                return None
            reported = len(self.diags)
            team = None
            if rc.team is not None:
                team = self.team_of(rc.team, rc.span)
                if team is None:
                    return None
                outer = dict(self.lets)
                self.lets[rc.var] = team.member(ir.Var(rc.var))
            src = self.region(rc.operand, loop_vars + (rc.var,), "source")
            if team is not None:
                self.lets = outer
            if dst is None or src is None:
                return None
            self._same_type(dst[1], src[1], st.span)
            self._computable(dst[1], "a reduction", st.span)
            used = (src[0].rank.names() if src[0].rank else frozenset()) | src[0].lo.names()
            if len(self.diags) == reported and rc.var not in used:
                self.err(Codes.BAD_REF, f"the reduction's operand does not depend on {rc.var}, so every "
                         "term is the same element", rc.operand.span)
            op = self.op(rc.op, rc.span)
            if op is None:
                return None
            if team is not None:
                return ir.Reduce(dst[0], op, src[0], rc.var, ir.Domain(rc.domain), st.span,
                                 count=team.size, skip=team.index)
            return ir.Reduce(dst[0], op, src[0], rc.var, ir.Domain(rc.domain), st.span)
        if isinstance(st.value, ast.ReduceList):
            return self.reduce_list(st, st.value, dst, loop_vars, engine)
        src = self.region(st.value, loop_vars, "source")
        if dst is None or src is None:
            return None
        self._same_type(dst[1], src[1], st.span)
        if engine is ir.Engine.SDMA and dst[0].rank is not None and src[0].rank is not None:
            self.err(Codes.BAD_ENGINE, "an SDMA copy reads or writes the running rank's memory: one "
                     "side must be local (no @)", st.span)
            return None
        if engine is ir.Engine.AUTO and dst[0].rank is not None and src[0].rank is not None:
            # `auto` sends large copies to SDMA at run time, where one side must be local
            self.err(Codes.BAD_ENGINE, "an `on auto` copy may go to SDMA, which reads or writes the "
                     "running rank's memory: make one side local (no @), or copy `on aiv`", st.span)
            return None
        return ir.Copy(dst[0], src[0], st.span)

    def reduce_list(self, st: ast.Assign, rl: ast.ReduceList, dst, loop_vars, engine: ir.Engine):
        """`dst = op(a, b, ...)`: two or more regions, each of dst's type and (checked per
        instance) of its length; dst and each source may be a peer's."""
        if engine is ir.Engine.SDMA:
            self.err(Codes.BAD_ENGINE, "SDMA cannot compute: reductions run `on aiv`", rl.span)
            return None
        srcs = [self.region(r, loop_vars, "source") for r in rl.operands]
        op = self.op(rl.op, rl.span)
        if dst is None or op is None or any(x is None for x in srcs):
            return None
        for x in srcs:
            self._same_type(dst[1], x[1], st.span)
        self._computable(dst[1], "a reduction", st.span)
        return ir.ReduceList(dst[0], op, tuple(x[0] for x in srcs), st.span)

    def accum(self, st: ast.Accum, loop_vars, engine: ir.Engine):
        if engine is not ir.Engine.AIV:
            self.err(Codes.BAD_ENGINE, "reduce on write is an atomic accumulate of the vector cores' "
                     "DMA: write it `on aiv`", st.span)
            return None
        op = self.op(st.op, st.span)
        dst = self.region(st.target, loop_vars, "destination")
        src = self.region(st.value, loop_vars, "source")
        if op is None or dst is None or src is None:
            return None
        self._same_type(dst[1], src[1], st.span)
        self._computable(dst[1], "reduce on write", st.span)
        return ir.Accumulate(dst[0], op, src[0], st.span)
