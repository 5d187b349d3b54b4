"""Schedule calls on the CPU build: a verified, built schedule bound to a communicator.

In: a .strata source, the communicator's world and the pass options. Out: a `Module` whose
attributes are `Schedule` callables. A call checks every tensor (on the heap, dtype, shape against
the schedule's sizes, aliasing, routing inputs) and then its instance (every region against the
tensors, and the verifier's proof of exactly that instance: stratac.host.instance) before it
launches, so that what runs is what was proven; then it launches through the generated launcher
and reports a failure of the machine as a StrataRuntimeError.
"""

from __future__ import annotations

import hashlib
import inspect
import json

import cffi
import torch

from stratac import ir, verify
from stratac.codegen import abi
from stratac.codegen.pipeline import Compiled, compile_schedules
from stratac.diagnostics import Source
from stratac.host import instance
from stratac.host.cores import auto_cores, host_cores
from stratac.host.cpu_model import last_error
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.ir import passes
from stratac.targets import cpu as build
from stratac.targets import verdicts

SYNC_SLOTS = abi.SYNC_SLOTS            # flag slots (64 B each) after the world barrier slots
_TORCH_DTYPES = {d: getattr(torch, d.torch_name) for d in ir.DType}
ROUTE_MAX_EXPERTS = 8192   # strata::kMaxExperts (runtime/device/strata_device.h)
ROUTE_MAX_TOPK = 64        # strata::Router::kMaxTopk
# The mask of a call without one: every bit set, at any world (bit r of a mask: rank r is live)
ALL_RANKS = -1


def compile_source(source: Source, options: passes.Options, worlds: list[int]) -> list[Compiled]:
    """The compile pipeline (stratac.codegen.pipeline): verified before and after the passes at the
    given world sizes (the proof before them kept as a verdict: prove_worlds), then generated."""
    return compile_schedules(source, options, worlds, prove_worlds)


# the verdict key of a schedule's proof at a world's default samples: a name no size or rank
# parameter can have, beside the call verdicts' (stratac.host.instance)
SAMPLES_KEY = "default samples"


class _Unproven(Exception):
    pass


def prove_worlds(s: ir.Schedule, worlds: list[int]) -> list[verify.Result]:
    """verify.verify_worlds with each world's proof kept as a verdict (stratac.targets.verdicts,
    keyed by the IR, stratac's code and the world): the ranks of a job that load a file at once
    prove each schedule once, one of them proving while the others wait for its verdict (at world
    128 every rank proving it again took longer than the run's deadline). Returns the results up
    to the first instance that fails, which is not kept; [] when every world is proven."""
    failed: list[verify.Result] = []
    for w in worlds:
        def prove() -> dict:
            results = verify.verify_worlds(s, [w])
            if not all(r.ok for r in results):
                failed.extend(results)
                raise _Unproven
            return {"instances": len(results)}
        try:
            verdicts.verdict(s, w, {SAMPLES_KEY: 1}, prove)
        except _Unproven:
            return failed
    return []


def _written_params(s: ir.Schedule) -> set[str]:
    """The parameters a schedule writes (destinations of its moves, and its contract's outputs)."""
    names = {p.name for p in s.params}
    out = {n for n in getattr(s.contract, "outputs", ()) if n in names}

    def walk(ops) -> None:
        for op in ops:
            dst = getattr(op, "dst", None)
            if getattr(dst, "buffer", None) in names:
                out.add(dst.buffer)
            for attr in ("body", "then", "orelse"):
                sub = getattr(op, attr, None)
                if isinstance(sub, (tuple, list)):
                    walk(sub)

    walk(s.body)
    return out


def _check_manifest(s: ir.Schedule, built: build.Built | build.OnDemand, world: int, worlds: tuple[int, ...]) -> None:
    """The library about to be loaded is the one this schedule was compiled to, for this world."""
    m = built.manifest
    if m.get("schedule") != s.name or m.get("launcher") != abi.launcher_name(s):
        raise StrataUsageError(f"{s.name}: the manifest of the library built from {built.identity} "
                               f"describes {m.get('schedule')!r} with launcher {m.get('launcher')!r}, not this "
                               "schedule: refusing to load it")
    mworlds = m.get("worlds")
    if worlds and world not in worlds or mworlds and world not in mworlds:
        raise StrataUsageError(f"{s.name} was verified for world size(s) "
                               f"{', '.join(map(str, worlds or mworlds))}, but the communicator has world "
                               f"{world}: load it through this communicator (comm.load) so that it is "
                               "verified for its world")


def make_selectors(module, selection) -> dict:
    """One Selector per collective contract of the module (MoE and AllToAllV are called by name),
    set as an attribute named after the contract unless a schedule has that name."""
    from stratac.host import select
    table = select.load_table(selection)
    by_kind: dict = {}
    for fn in module.schedules.values():
        if not fn.ir.contract.kind.moe:
            by_kind.setdefault(fn.ir.contract.kind, []).append(fn)
    out = {}
    for kind, fns in by_kind.items():
        sel = out[kind.value] = select.Selector(module, kind, fns, table)
        if kind.value not in module.schedules:
            setattr(module, kind.value, sel)
    return out


class Module:
    """The schedules of one .strata source, each a callable attribute."""

    def __init__(self, comm, compiled: list[Compiled], selection=None):
        self.comm = comm
        self.schedules: dict[str, Schedule] = {}
        for c in compiled:   # each entry point is built when a call first launches it
            fn = Schedule(comm, c.schedule, build.OnDemand(c.output), worlds=c.worlds)
            self.schedules[c.schedule.name] = fn
            setattr(self, c.schedule.name, fn)
        self.selectors = make_selectors(self, selection)

    def __getitem__(self, name: str) -> "Schedule":
        return self.schedules[name]

    def collective(self, kind: str):
        """The selecting entry point of a contract (also `mod.<kind>` unless a schedule has that
        name): stratac.host.select.Selector."""
        if kind not in self.selectors:
            raise StrataUsageError(f"no schedule of this module implements {kind}; it has "
                                   f"{', '.join(sorted(self.selectors)) or 'no collective'}")
        return self.selectors[kind]

    def unload(self) -> None:
        for fn in self.schedules.values():
            fn.unload()


def check_world_constraints(s: ir.Schedule, world: int) -> None:
    """A schedule that declares `requires ...` refuses a communicator whose world violates it,
    naming the constraint and its source line, before anything else about the call is looked at."""
    unmet = ir.unmet_requirement(s, world)
    if unmet is not None:
        raise StrataUsageError(f"{s.name} does not support world {world}: it {unmet}")


def _bounded_window(s: ir.Schedule) -> str | None:
    """The window whose rows an exscan's offsets index (the bound the status line reports)."""
    offs = {op.dst.buffer for op in passes.routes(s) if op.kind is ir.RouteKind.EXSCAN}
    for op in passes.routes(s):
        role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
        if role.get("offs") in offs and op.kind in (ir.RouteKind.PLACE, ir.RouteKind.GATHER):
            return op.dst.buffer if op.kind is ir.RouteKind.PLACE else role["win"]
    return None


class Schedule:
    """A compiled schedule bound to a communicator: call it with heap tensors (and, if the schedule
    has them, `op=` a reduction and rank parameters such as `root=` as keywords)."""

    def __init__(self, comm, s: ir.Schedule, built: build.Built | build.OnDemand,
                 worlds: tuple[int, ...] = ()):
        self.comm, self.ir, self.built = comm, s, built
        self.name = s.name
        _check_manifest(s, built, comm.world, worlds)
        self._written = _written_params(s)
        self._sync_described: tuple | None = None
        self._ffi = cffi.FFI()
        self._ffi.cdef(abi.cdef(s))
        # the launcher of each (dtype, op) a call used, from the library that holds its entry point
        # (built.library_for: on the CPU model, built when a call first needs it)
        self._libs: dict[str, object] = {}
        self._launchers: dict[tuple[ir.DType, int], object] = {}
        self._unloaded = False
        self._scratch: dict[str, torch.Tensor] = {}
        self._instances: dict[tuple, str | None] = {}   # instance -> None (proven) or the refusal
        self._calls: dict[tuple, _Prepared] = {}         # call signature -> its checked launch
        self.last_cores: int | None = None               # the cores the last call launched on
        self.cores = s.kernel.cores
        # the ranks compare each call's record before any writes to another (strata::Agree); the
        # schedule's part of it is its name, its kernel (the build's identity hashes the compiled
        # sources, whichever entries a library holds) and its manifest (the options it was lowered
        # with, the worlds it was proven for)
        self._agree = s.kernel.agreement
        manifest = hashlib.sha256(json.dumps(built.manifest, sort_keys=True).encode()).hexdigest()
        self._identity = f"{s.name}\0{built.identity}\0{manifest}"
        # a packed routing (exscan) checks its window's bound on the device (abi.STATUS_*)
        self._window = _bounded_window(s)
        self._bounded = any(op.kind is ir.RouteKind.EXSCAN for op in passes.routes(s))
        # the SoC the kernel was lowered for, and its vector (AIV) core count: a launch may not use
        # more blocks (SyncAll hangs on the NPU when numBlocks exceeds the physical AIV count)
        self.soc = s.kernel.soc
        self.max_cores = passes.SOCS[self.soc]
        params = [p.name for p in s.tensors] + [x.name for x in s.scalars]
        self.__doc__ = f"{s.name}({', '.join(params)}): implements {s.contract}"
        kw = inspect.Parameter.KEYWORD_ONLY
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               annotation=f"{'sym ' if p.symmetric else ''}{p.type_text}[{p.shape_text}]")
             for p in s.tensors]
            + [inspect.Parameter(x.name, kw, annotation=x.kind.value) for x in s.scalars]
            + [inspect.Parameter("cores", kw, default=None)]
            + ([inspect.Parameter("active", kw, default=None)] if ir.takes_mask(s) else []))

    def launch_cores(self, cores, limit: int, sizes: dict[str, int] | None = None,
                     dtype: ir.DType | None = None) -> int:
        """The vector cores a call launches on: cores itself when given, which must be a whole
        number in [1, limit] (0 is not "all cores"; limit is the vector core count of the SoC the
        kernel was compiled for); when None, the number that follows the bytes the call moves
        (stratac.host.cores: one per 64 KiB of its largest buffer, at most auto_limit()), or the
        plan's cores when the sizes are not known yet."""
        if cores is None:
            if sizes is None or dtype is None:
                return self.cores
            return auto_cores(self.ir, self.comm.world, sizes, dtype.nbytes, self.auto_limit())
        if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= limit:
            raise StrataUsageError(
                f"{self.name}: cores must be between 1 and {limit}, got {cores!r} ({limit} is the vector "
                f"core count of {self.soc}, the SoC it was compiled for; compile for another with "
                f"passes.Options(soc=...) or --soc)")
        return cores

    def auto_limit(self) -> int:
        """The most cores a call launches on unless it names them: on the CPU model the plan's
        cores, capped at the CPUs each rank of the world has on this host (stratac.host.cores)."""
        return min(self.cores, host_cores(self.comm.world))

    def _launcher(self, dtype: ir.DType, op: int):
        """The launcher to call for element type `dtype` and reduction index `op` (abi.OPS; 0
        without a redop parameter)."""
        fn = self._launchers.get((dtype, op))
        if fn is None:
            if self._unloaded:
                raise StrataUsageError(f"{self.name} was unloaded (its communicator was closed)")
            kernel = abi.kernel_name(self.ir, dtype, abi.OPS[op] if self.ir.op_param else None)
            library = str(self.built.library_for(kernel))
            lib = self._libs.get(library)
            if lib is None:
                lib = self._libs[library] = self._ffi.dlopen(library)
            fn = self._launchers[(dtype, op)] = getattr(lib, abi.launcher_name(self.ir))
        return fn

    def unload(self) -> None:
        self._unloaded = True
        self._launchers.clear()
        self._calls.clear()
        for lib in self._libs.values():
            self._ffi.dlclose(lib)
        self._libs.clear()

    def bind(self, *tensors: torch.Tensor, **named) -> tuple[ir.DType, dict[str, int], list, dict]:
        """Checks the arguments against the schedule's parameters before anything is launched;
        returns dtype, sizes, tensor pointers and scalar values (the op as its index in abi.OPS)."""
        params = self.ir.tensors
        names = [p.name for p in params]
        if len(tensors) > len(params):
            raise StrataUsageError(f"{self.name} takes {len(params)} tensors "
                                   f"({', '.join(names)}), got {len(tensors)}")
        given = dict(zip(names, tensors))
        scalars = {x.name: x for x in self.ir.scalars}
        values: dict[str, object] = {}
        for k, v in named.items():
            if k in scalars:
                values[k] = v
            elif k in names:
                given[k] = v
            else:
                raise StrataUsageError(f"{self.name} has no parameter {k!r}")
        missing = [n for n in names if n not in given] + [n for n in scalars if n not in values]
        if missing:
            raise StrataUsageError(f"{self.name}: missing argument(s) {', '.join(missing)}")
        scalar_args = {}
        for name, x in scalars.items():
            v = values[name]
            if x.kind is ir.ScalarKind.REDOP:
                ops = {o.value: i for i, o in enumerate(abi.OPS)}
                if v not in ops:
                    raise StrataUsageError(f"{self.name}: {name} must be one of {', '.join(ops)}, got {v!r}")
                scalar_args[name] = ops[v]
            elif x.kind is ir.ScalarKind.DIVISOR:
                w = self.comm.world
                if isinstance(v, bool) or not isinstance(v, int) or not (v >= 1 and w % v == 0):
                    divisors = ", ".join(str(d) for d in range(1, w + 1) if w % d == 0)
                    raise StrataUsageError(f"{self.name}: {name} must divide the world ({w}): one of "
                                           f"{divisors}; got {v!r}")
                scalar_args[name] = v
            else:
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.comm.world:
                    raise StrataUsageError(f"{self.name}: {name} must be a rank in [0, {self.comm.world}), "
                                           f"got {v!r}")
                scalar_args[name] = v
        dtype: ir.DType | None = None
        for p in params:
            t = given[p.name]
            self.comm.offset_of(t, f"{self.name}: parameter {p.name}")
            want = p.dtype
            got = next((d for d, td in _TORCH_DTYPES.items() if td == t.dtype), None)
            if got is None:
                raise StrataUsageError(f"{self.name}: parameter {p.name} has dtype {t.dtype}; "
                                       f"supported: {', '.join(str(v) for v in _TORCH_DTYPES.values())}")
            if want is not None and got is not want:
                raise StrataUsageError(f"{self.name}: parameter {p.name} must be {want.torch_name}, "
                                       f"got {t.dtype}")
            if p.typevar:
                if dtype is not None and got is not dtype:
                    raise StrataUsageError(f"{self.name}: parameter {p.name} is {t.dtype} but an "
                                           f"earlier {p.typevar} parameter is {_TORCH_DTYPES[dtype]}")
                dtype = got
        dtype = dtype or next(p.dtype for p in params)
        if self.ir.contract.kind.moe and dtype not in abi.dtypes(self.ir):
            raise StrataUsageError(f"{self.name}: the tokens must be float32, float16 or bfloat16, got "
                                   f"{_TORCH_DTYPES[dtype]}")
        if dtype not in abi.dtypes(self.ir):   # a type variable's: no kernel was built for int8
            raise StrataUsageError(f"{self.name} is built for "
                                   f"{', '.join(str(_TORCH_DTYPES[d]) for d in abi.dtypes(self.ir))}, not "
                                   f"{_TORCH_DTYPES[dtype]}: int8 is a payload to move (a quantised MoE "
                                   "dispatch's rows), not a type variable's type")
        sizes: dict[str, int] = {}
        env = {"world": self.comm.world}
        rules, _ = ir.size_rules(params, self.ir.sizes)
        for rule in rules:
            p, t = self.ir.param(rule.param), given[rule.param]
            if len(p.dims) > 1 and t.dim() != len(p.dims):
                raise StrataUsageError(f"{self.name}: parameter {p.name} must have shape [{p.shape_text}] "
                                       f"({len(p.dims)} dimensions), got {list(t.shape)}")
            extent = t.numel() if len(p.dims) == 1 else t.shape[rule.dim]
            scale = rule.scale.eval(env)
            sizes[rule.sym] = env[rule.sym] = extent // scale if scale else 0
        elem = ir.elem_env(self.ir, dtype.nbytes)   # sizeof(T): an instance per element size
        sizes.update(elem)
        env.update(elem)
        for p in params:
            t = given[p.name]
            if len(p.dims) > 1:
                want_shape = [d.eval(env) for d in p.dims]
                if list(t.shape) != want_shape:
                    raise StrataUsageError(f"{self.name}: parameter {p.name} must have shape [{p.shape_text}] "
                                           f"= {want_shape}, got {list(t.shape)}")
            want = p.size.eval(env)
            if t.numel() != want:
                raise StrataUsageError(f"{self.name}: parameter {p.name} must have {p.size} = {want} "
                                       f"elements, got {t.numel()}")
        for b, cols in passes.window_row_faults(self.ir, dtype, env):
            names = sorted(b.shape[1].names() & set(sizes))
            padded = ir.padded_row(cols, b.dtype or dtype)
            said = ", ".join(f"{n} = {sizes[n]}" for n in names) or f"{ir.bare(b.shape[1])}"
            raise StrataUsageError(
                f"{self.name}: on rank {self.comm.rank}, parameter {b.name}'s rows ({said}) are "
                f"{cols * (b.dtype or dtype).nbytes} bytes: place writes them from several ranks into "
                f"one {ir.WINDOW_ROW_ALIGN}-byte block of a peer's window, which the NPU does not "
                f"promise to keep byte-exact; pad the rows to {padded} columns"
                + (f" ({names[0]} = {padded})" if names == [str(ir.bare(b.shape[1]))] else "")
                + " (stratac.host.moe.Buffer does) and keep the values in the first "
                f"{cols}; nothing was written")
        if self.ir.contract.kind.moe:
            self._check_routing(given, env)
        self._check_aliasing(given)
        self._check_instance(self.instance_params(sizes, scalar_args))
        ptrs = [self._ffi.cast("void*", given[p.name].data_ptr()) for p in params]
        env.update((x.name, scalar_args[x.name]) for x in self.ir.int_params)   # a scratch's size may name g
        ptrs += [self._ffi.cast("void*", t.data_ptr()) for t in self._scratch_for(dtype, env)]
        return dtype, sizes, ptrs, scalar_args

    def _check_instance(self, params: dict[str, int], active: int = ALL_RANKS) -> None:
        """The instance these sizes and rank parameters make (and the mask of active ranks, when
        there is one) touches only what exists and is proven (stratac.host.instance); decided once
        per instance and remembered, refusals too."""
        key = (tuple(sorted(params.items())), active)
        if key not in self._instances:
            try:
                live = None if active == ALL_RANKS else tuple(bool(active >> r & 1)
                                                              for r in range(self.comm.world))
                instance.check(self.ir, self.comm.world, params, live)
                self._instances[key] = None
            except StrataUsageError as exc:
                self._instances[key] = str(exc)
        refused = self._instances[key]
        if refused is not None:
            raise StrataUsageError(refused)

    def active_bits(self, active) -> int:
        """The mask of active ranks of a call as an int (bit r: rank r takes part; ALL_RANKS
        without a mask or when every rank is live), which the host writes into the sync area for
        the kernel (Communicator.write_mask). `active` is None, or one
        entry per rank (a 1-D torch tensor of bool or integers, or a list or tuple), each true/1
        (live) or false/0 (masked). docs/robustness.md, "Masked ranks"."""
        if active is None:
            return ALL_RANKS
        world, rank = self.comm.world, self.comm.rank
        if not ir.takes_mask(self.ir):
            raise StrataUsageError(f"{self.name}: only MoE dispatch and combine schedules take a mask "
                                   "of active ranks (active=); this one implements "
                                   f"{self.ir.contract.kind.value}")
        if isinstance(active, torch.Tensor):
            if active.dim() != 1:
                raise StrataUsageError(f"{self.name}: active must be a 1-D tensor of {world} entries (one "
                                       f"per rank), got shape {list(active.shape)}")
            if active.dtype.is_floating_point or active.dtype.is_complex:
                raise StrataUsageError(f"{self.name}: active must be a bool or integer tensor, got "
                                       f"{active.dtype}")
            values = active.tolist()
        elif isinstance(active, (list, tuple)):
            values = list(active)
        else:
            raise StrataUsageError(f"{self.name}: active must be a tensor, list or tuple of {world} "
                                   f"entries (one per rank), got {type(active).__name__}")
        if len(values) != world:
            raise StrataUsageError(f"{self.name}: active must have one entry per rank ({world}), got "
                                   f"{len(values)}")
        for i, v in enumerate(values):
            if not isinstance(v, (bool, int)) or v not in (0, 1):
                raise StrataUsageError(f"{self.name}: active[{i}] = {v!r}; each entry must be true/1 "
                                       "(the rank takes part) or false/0 (masked)")
        if not values[rank]:
            raise StrataUsageError(f"{self.name}: active[{rank}] is false on rank {rank} itself: a masked "
                                   "rank does not call (every live rank passes the same mask)")
        if all(values):
            return ALL_RANKS
        if world > ir.MASK_MAX_WORLD:
            raise StrataUsageError(f"{self.name}: a mask of active ranks needs a world of at most "
                                   f"{ir.MASK_MAX_WORLD} (the kernels hold it in UB, one bit per rank); "
                                   f"this communicator has {world}")
        return sum(1 << r for r, v in enumerate(values) if v)

    def instance_params(self, sizes: dict[str, int], scalars: dict) -> dict[str, int]:
        """The parameters of a call's instance: its sizes and rank and divisor parameters."""
        return {**sizes, **{x.name: scalars[x.name] for x in self.ir.int_params}}

    def _check_routing(self, given: dict, env: dict) -> None:
        """Expert ids are checked before anything is written: a bad id would send a token into
        another expert's rows (or outside the window)."""
        c, world = self.ir.contract, self.comm.world
        ids_name = c.inputs[1]
        counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
        experts = self.ir.param(counts).dims[1].eval(env)
        ids = given[ids_name]
        topk = ids.shape[1] if ids.dim() == 2 else 1
        if experts % world or experts < 1:
            raise StrataUsageError(f"{self.name}: {experts} experts do not divide over {world} ranks "
                                   "(the number of experts must be a positive multiple of the world size)")
        if experts > ROUTE_MAX_EXPERTS:
            raise StrataUsageError(f"{self.name}: {experts} experts; the kernels count at most "
                                   f"{ROUTE_MAX_EXPERTS}")
        if topk > experts or topk > ROUTE_MAX_TOPK:
            raise StrataUsageError(f"{self.name}: topk = {topk} must be at most the number of experts "
                                   f"({experts}) and at most {ROUTE_MAX_TOPK}")
        bad = (ids < -1) | (ids >= experts)
        if bool(bad.any()):
            at = tuple(int(v) for v in bad.nonzero()[0])
            what = "a rank" if c.kind is ir.ContractKind.ALLTOALLV else "an expert"
            raise StrataUsageError(f"{self.name}: {ids_name}[{', '.join(map(str, at))}] = {int(ids[at])} "
                                   f"is not {what}: it must lie in [0, {experts}) or be -1 (none); "
                                   "nothing was written")
        if c.capacity:
            cap = env[c.capacity]
            valid = ids[ids >= 0].to(torch.int64)
            per = torch.bincount(valid, minlength=experts) if valid.numel() else torch.zeros(experts)
            worst = int(per.max()) if per.numel() else 0
            if worst > cap:
                e = int(per.argmax())
                raise StrataUsageError(f"{self.name}: {worst} tokens of rank {self.comm.rank} go to expert "
                                       f"{e}, more than the capacity of {cap} slots per (expert, source "
                                       "rank); nothing was written (raise the capacity: a larger window)")

    def _scratch_for(self, dtype: ir.DType, env: dict) -> list[torch.Tensor]:
        """Scratch buffers (staging baselines only), allocated on the heap at the first call of a
        size and kept; allocation is collective, like every call."""
        out = []
        for p in self.ir.scratch:
            n = p.size.eval(env)
            tdtype = _TORCH_DTYPES[p.dtype or dtype]
            have = self._scratch.get(p.name)
            if have is None or have.numel() != n or have.dtype != tdtype:
                if have is not None:
                    self.comm.free(have)
                self._calls.clear()                      # their launches hold the old pointers
                have = self._scratch[p.name] = self.comm.empty(max(n, 1), dtype=tdtype)
            out.append(have)
        return out

    def release_scratch(self) -> None:
        """Frees the scratch buffers a staging baseline keeps between calls. Collective."""
        for t in reversed(list(self._scratch.values())):
            self.comm.free(t)
        self._scratch.clear()
        self._calls.clear()

    def _check_aliasing(self, given: dict) -> None:
        """Two tensors that share memory are refused when the schedule writes either: the verifier
        proved the schedule for separate buffers (an in-place variant is a different schedule)."""
        spans = [(name, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                 for name, t in given.items() if isinstance(t, torch.Tensor) and t.numel() > 0]
        for i, (a, lo_a, hi_a) in enumerate(spans):
            for b, lo_b, hi_b in spans[i + 1:]:
                if lo_a < hi_b and lo_b < hi_a and (a in self._written or b in self._written):
                    w = " and ".join(n for n in (a, b) if n in self._written)
                    raise StrataUsageError(
                        f"{self.name}: parameters {a} and {b} share memory (heap bytes "
                        f"[{max(lo_a, lo_b) - self.comm._base}, {min(hi_a, hi_b) - self.comm._base}) "
                        f"overlap) and the schedule writes {w}: pass separate tensors")

    def _describe_sync(self, params: dict[str, int]) -> None:
        """Names the flag slots of this call's sync area for the model's wait-timeout messages, and
        refuses flags that would not fit the area (nothing may be written outside it). params: the
        instance's (sizes, rank and divisor parameters)."""
        key = tuple(sorted(params.items()))
        if self._sync_described != key:
            env = {"world": self.comm.world, **params}
            base, parts = self.comm.world, []
            for f in self.ir.flags:
                n = int(f.size.eval(env))
                parts.append(f"{f.name} {base} {n}")
                base += n
            if base > self.comm.world + SYNC_SLOTS:
                raise StrataUsageError(f"{self.name}: its flags need {base - self.comm.world} slots at these "
                                       f"sizes, more than the {SYNC_SLOTS} of the communicator's sync area")
            self._layout = ";".join(parts).encode()
            self._sync_described = key

    def __call__(self, *tensors: torch.Tensor, cores: int | None = None, active=None,
                 **named) -> None:
        """Checks the call (bind: every check, see docs/api.md) and launches. What bind decided
        depends only on the call's signature (each tensor's address, dtype, shape, strides, device
        and allocation; the scalars; cores), so it is kept per signature (_Prepared) and a later
        call with the same signature re-checks only what the signature cannot fix: that the
        communicator is open, that every tensor's allocation is still live (not given back with
        comm.free), and, for MoE, the routing (the ids' values). The proof of the instance is the
        one bind found for these sizes: what runs is what was proven."""
        comm = self.comm
        comm._check_open()
        if self._unloaded:
            raise StrataUsageError(f"{self.name} was unloaded (its communicator was closed)")
        bits = self.active_bits(active)
        try:
            key = (tuple(map(_signature, tensors)),
                   tuple((k, type(v), _signature(v) if isinstance(v, torch.Tensor) else v)
                         for k, v in named.items()),
                   type(cores), cores)
            prep = self._calls.get(key)
        except (AttributeError, TypeError, RuntimeError):   # not tensors, unhashable: bind says why
            key = prep = None
        if prep is not None:
            live = comm._live
            if not all(c in live for c in prep.storages):
                prep = None                                  # freed since: bind names the tensor
            elif prep.routed:
                self._check_routing(self._given(tensors, named), prep.env)
        if prep is None:
            prep = self._prepare(tensors, named, cores)
            if key is not None:
                if len(self._calls) >= _MAX_SIGNATURES:
                    self._calls.clear()
                self._calls[key] = prep
        if bits != ALL_RANKS:   # the masked variant of this instance must be proven too
            self._check_instance(prep.params, bits)
        self.last_cores = prep.blocks
        if comm._sync_owner is not prep:   # names the flags for the model's timeout messages
            comm._lib.strata_cpu_describe_sync(prep.head[4], comm.world, prep.layout)
            comm._sync_owner = prep
        # the CPU model refuses launches of more blocks than the SoC the kernel was lowered for has
        # (runtime/cpu/src/launch.cpp LaunchBlocks): tell it which SoC that is when it changes
        # (modules of one communicator may be compiled for different SoCs)
        if comm._aiv_cores != self.max_cores:
            if comm._lib.strata_cpu_set_aiv_cores(self.max_cores) != 0:
                raise StrataRuntimeError(f"{self.name}: {last_error(comm._lib, comm._ffi)}")
            comm._aiv_cores = self.max_cores
        comm.set_active(bits)   # waits of the model stop early only for a live rank's death
        if prep.masked:
            comm.write_mask(bits)
        comm.watch_signals()
        epoch, call = comm.next_call(prep.stamps)
        if self._agree:
            record = prep.records.get(bits) or self._record(prep, bits)
            comm.write_record(epoch & 1, call, record)
        rc = prep.launch(*prep.head, epoch, *prep.tail)
        # a SIGINT or SIGTERM during the launch stopped its waits (runtime/cpu/src/host_signals.cpp
        # OnHostSignal); Python's own handler has run by now (KeyboardInterrupt), unless the
        # signal's action was the default
        held = comm._lib.strata_cpu_take_signal()
        if held:
            comm.end_on_signal(held, self.name)
        if rc != 0:
            why = last_error(comm._lib, comm._ffi)
            if self._agree and prep.masked:
                self._masked_out(call, epoch & 1, bits, why)
            raise StrataRuntimeError(f"{self.name} failed on rank {comm.rank}: {why}")
        if self._agree and comm.disagreed(call):
            self._disagreement(call, epoch & 1, bits)
        self.check_status()

    def describe_call(self, prep: "_Prepared", bits: int) -> str:
        """The call as messages name it: allreduce_twoshot(n=900, f32, sum)."""
        parts = [f"{k}={v}" for k, v in prep.sizes.items()] + [prep.dtype.short]
        if self.ir.op_param is not None:
            parts.append(abi.OPS[prep.head[1]].value)
        parts += [f"{x.name}={prep.params[x.name]}" for x in self.ir.int_params]
        if bits != ALL_RANKS:
            parts.append(mask_text(bits, self.comm.world))
        return f"{self.name}({', '.join(parts)})"

    def _record(self, prep: "_Prepared", bits: int) -> tuple[tuple[int, ...], bytes]:
        """A call's agreement record but its number: four int32 of a hash of the schedule and the
        call's instance (world, sizes, dtype, op, rank and divisor parameters, mask, and the heap
        offsets of its symmetric tensors and scratch: a kernel addresses a peer's at its own's
        offset), and its description."""
        key = repr((self._identity, self.comm.world, sorted(prep.sizes.items()), prep.dtype.short,
                    prep.head[1] if self.ir.op_param is not None else None,
                    sorted((x.name, prep.params[x.name]) for x in self.ir.int_params), bits, prep.offsets))
        h = hashlib.blake2b(key.encode(), digest_size=16).digest()
        digest = tuple(int.from_bytes(h[i:i + 4], "little", signed=True) for i in range(0, 16, 4))
        text = self.describe_call(prep, bits).encode()[:abi.AGREE_TEXT_BYTES - 1]
        prep.records[bits] = record = (digest, text.ljust(abi.AGREE_TEXT_BYTES, b"\0"))
        return record

    def _masked_out(self, call: int, parity: int, bits: int, why: str) -> None:
        """A masked call that failed (a wait that reached its deadline): when a live peer made this
        call with another mask, its mask may leave this rank out, and then it never announces its
        entry to this rank (strata::Agree signals the ranks of its own mask only: a rank it masks
        may be dead). The peers that pass the agreement name the difference at once; this rank
        learns it at the deadline, and says so with every live rank's call, from their records."""
        comm = self.comm
        mine = comm.read_record(comm.rank, parity)[0]
        ranks = [r for r in range(comm.world) if bits >> r & 1]
        records = {r: comm.read_record(r, parity) for r in ranks}
        if not any(words[0] == call and words != mine for words, _, _ in records.values()):
            return
        raise StrataUsageError(
            f"{self.name} on rank {comm.rank}: the ranks made different calls as call {call} of this "
            f"communicator: {_calls_text(records, call)}. A live rank whose mask leaves this rank out "
            f"does not wait for it or announce itself to it, so this rank waited until the deadline "
            f"({why}). Nothing was written to another rank; every live rank must pass the same mask")

    def _disagreement(self, call: int, parity: int, bits: int) -> None:
        """The kernel of call `call` found a live peer whose record differs and returned without
        writing (every live rank's kernel does: each reads every live peer's record). Names every
        live rank's call from the records, puts the ranks' stamps back in step, and raises."""
        comm = self.comm
        ranks = [r for r in range(comm.world) if bits >> r & 1]
        records = {r: comm.read_record(r, parity) for r in ranks}
        comm.settle_disagreement([epoch for _, epoch, _ in records.values()])
        # each rank sized its scratch by its own call (its sizes, its divisor parameters): every
        # live rank gives it back here, so that the heaps are laid out alike again for the next call
        self.release_scratch()
        texts = {text for _, _, text in records.values()}
        if len(texts) == 1 and len({words[0] for words, _, _ in records.values()}) == 1:
            what = (f"every rank called {texts.pop()}, but from kernels built differently (another .strata "
                    "source or other compile options on some rank) or on symmetric tensors at different heap "
                    "offsets (a symmetric tensor must be the same allocation on every rank)")
        else:
            what = _calls_text(records, call)
        raise StrataUsageError(
            f"{self.name} on rank {comm.rank}: the ranks made different calls as call {call} of this "
            f"communicator: {what}. Nothing was written on any rank (the ranks compare their calls before "
            "any writes to another); every rank must make the same calls in the same order")

    def check_status(self) -> None:
        """After a packed MoE call (one with an exscan): the status line the kernel left says whether
        some owner would have received more rows than its window holds; then nothing was placed or
        gathered on any rank, and every rank raises the same error."""
        if not self._bounded:
            return
        line = self.comm.status_line()
        if line[abi.STATUS_OVER] == 0:
            return
        owner, rows, bound, over = (line[abi.STATUS_OWNER], line[abi.STATUS_ROWS],
                                    line[abi.STATUS_BOUND], line[abi.STATUS_OWNERS_OVER])
        win = self._window
        region = self.ir.contract.region
        sym = region or (self.ir.param(win).dims[0] if win else None)
        what = "placed" if self.ir.contract.kind.dispatch or self.ir.contract.kind is ir.ContractKind.ALLTOALLV \
            else "gathered"
        who, holds = (f"expert {owner}", f"the {bound} rows of its region of {win} ({sym} = {bound})") if region \
            else (f"rank {owner}", f"the {bound} rows of its window {win} ({sym} = {bound})")
        raise StrataRuntimeError(
            f"{self.name} on rank {self.comm.rank}: the routing sends {rows} rows to {who}, more than "
            f"{holds}"
            + (f"; {over} {'experts' if region else 'ranks'} are over the bound" if over > 1 else "")
            + f". Nothing was {what} on any rank (every rank reports this); raise {sym} to at least {rows}"
            + (f" or route fewer tokens to that {'expert' if region else 'rank'}" if self.ir.contract.kind.moe else ""))

    def _given(self, tensors: tuple, named: dict) -> dict:
        given = dict(zip((p.name for p in self.ir.tensors), tensors))
        given.update((k, v) for k, v in named.items() if isinstance(v, torch.Tensor))
        return given

    def _prepare(self, tensors: tuple, named: dict, cores) -> "_Prepared":
        """Every check of a call (bind), then the launcher's arguments but the epoch."""
        check_world_constraints(self.ir, self.comm.world)
        if cores is not None:
            self.launch_cores(cores, self.max_cores)         # a bad cores value first, as before
        dtype, sizes, ptrs, scalars = self.bind(*tensors, **named)
        blocks = self.launch_cores(cores, self.max_cores, sizes, dtype)
        params = self.instance_params(sizes, scalars)
        self._describe_sync(params)
        comm = self.comm
        given = self._given(tensors, named)
        op = scalars.get(self.ir.op_param.name, 0) if self.ir.op_param else 0
        return _Prepared(
            sizes=sizes, dtype=dtype, records={},
            # symmetric tensors and scratch: a peer's is addressed at the rank's own offset
            offsets=tuple(given[p.name].data_ptr() - comm._base for p in self.ir.tensors if p.symmetric)
            + tuple(self._scratch[p.name].data_ptr() - comm._base for p in self.ir.scratch if p.symmetric),
            storages=tuple(given[p.name].untyped_storage()._cdata for p in self.ir.tensors),
            blocks=blocks, routed=self.ir.contract.kind.moe, env={"world": comm.world, **params},
            layout=self._layout, stamps=self.ir.stamps({"world": comm.world, **params}),
            masked=ir.takes_mask(self.ir), params=params,
            launch=self._launcher(dtype, op),
            head=(dtype.code, op, blocks, self._ffi.NULL, self._ffi.cast("void*", comm._base + comm._sync)),
            tail=(*ptrs, *(sizes[n] for n in self.ir.sizes), *(scalars[x.name] for x in self.ir.int_params)))


_MAX_SIGNATURES = 64   # prepared calls kept per schedule (all dropped when there are more)


def _calls_text(records: dict, call: int) -> str:
    """Every rank's call from its agreement record (Communicator.read_record), ranks that made the
    same one together: `rank 0 called f(n=900), rank 1 f(n=1152) as call 3`."""
    groups: dict[tuple, list[int]] = {}
    for r, (words, _, text) in records.items():
        groups.setdefault((text, words[0]), []).append(r)
    parts = []
    for i, ((text, number), rs) in enumerate(groups.items()):
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
        parts.append(f"{who} {'called ' if i == 0 else ''}{text or '(nothing readable)'}"
                     + (f" as call {number}" if number != call else ""))
    return ", ".join(parts)


def mask_text(bits: int, world: int) -> str:
    """A call's mask of active ranks as messages name it: every entry up to world 64
    (`active=[1,0,1,1]`), the masked ranks above (`masked=[3,70]`), which stays readable in the
    agreement record's text at any world."""
    if world <= 64:
        return "active=[" + ",".join(str(bits >> r & 1) for r in range(world)) + "]"
    return "masked=[" + ",".join(str(r) for r in range(world) if not bits >> r & 1) + "]"


def _signature(t: torch.Tensor) -> tuple:
    """What bind's checks of a tensor depend on: where it is, its dtype, shape, strides (hence
    contiguity), device and allocation (the storage, whose liveness is checked at every call)."""
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.is_cpu, t.untyped_storage()._cdata)


class _Prepared:
    """A checked call's launcher arguments (all but the epoch), kept per signature."""

    __slots__ = ("storages", "blocks", "routed", "env", "layout", "stamps", "masked", "params", "launch", "head",
                 "tail", "sizes", "dtype", "records", "offsets")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)
