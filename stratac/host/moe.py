"""A DeepEP-style `Buffer` for MoE dispatch and combine, on the verified bounded prefill schedules.

In: a communicator (or the default torch.distributed group), the layer's sizes (hidden, the most
tokens a rank dispatches per call, experts, top-k, dtype) and the bound on the rows a rank
receives. Out: `dispatch(x, topk_idx, topk_weights)` -> (the received rows, the rows per local
expert, a handle) and `combine(y, handle)` -> the combined tokens, with per-rank time and bytes of
each call (`last_stats`, `stats(all_ranks=True)`) and, on request, a Perfetto trace.

The schedules are examples/moe_prefill_bounded.strata's, loaded (verified, compiled) once;
the heap tensors are allocated once, at `max_tokens` rows, and a call with fewer tokens pads its
expert ids with -1 (nothing is sent for them), so every call is the one proven instance and ranks
may dispatch different numbers of tokens, as with DeepEP.

    buf = Buffer(comm, hidden=1024, max_tokens=256, num_experts=32, topk=8, dtype=torch.bfloat16)
    recv_x, per_expert, handle = buf.dispatch(x, topk_idx, topk_weights)
    # recv_x: this rank's experts' rows, expert after expert (per_expert[l] rows for local expert l)
    y = my_experts(recv_x, per_expert)
    out = buf.combine(y, handle)          # out[t] = sum_k topk_weights[t, k] * y[row of (t, k)]
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from stratac import ir
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.host.schedule import ALL_RANKS
from stratac.resources import resource_path

# per (low-latency mode, int8 payload): the file, its dispatch and its combine
SCHEDULES = {(False, False): ("moe_prefill_bounded.strata", "moe_prefill_bounded_dispatch",
                             "moe_prefill_bounded_combine"),
             (True, False): ("moe_decode.strata", "moe_decode_dispatch", "moe_decode_combine"),
             (False, True): ("moe_prefill_int8.strata", "moe_prefill_int8_dispatch", "moe_prefill_int8_combine"),
             (True, True): ("moe_decode_int8.strata", "moe_decode_int8_dispatch", "moe_decode_int8_combine")}
_TOKEN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ALLOC_SLACK = 4096          # per heap allocation (alignment) in heap_bytes_needed
SCALE_COLS = 8               # an int8 window's scale row: 32 bytes, the per-token scale in column 0
HOST_TID = 999               # the trace track of a whole call as the host saw it (as stratac bench)


def default_schedules(low_latency_mode: bool = False, payload: torch.dtype | None = None) -> Path:
    """examples/moe_prefill_bounded.strata (moe_decode.strata in low-latency mode; their int8
    forms moe_prefill_int8.strata, moe_decode_int8.strata for an int8 payload) of a checkout, or
    the copy a wheel ships."""
    name = SCHEDULES[bool(low_latency_mode), payload == torch.int8][0]
    path = resource_path("examples", name)
    if not path.is_file():
        raise StrataUsageError(f"{name} is not in this installation ({path}): pass "
                               "Buffer(..., schedules=PATH) with the path of a copy")
    return path


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, f32 scales [tokens, 1]) of x, per token as `stratac run` quantises
    (tools/run/workload.py): scale = max |x| / 127 in f32 (1 for an all-zero row), q = x / scale
    rounded half to even, clamped to [-127, 127]. Dequantised: q.float() * scale."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True) if xf.shape[1] else torch.zeros(xf.shape[0], 1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(xf / scale).clamp(-127, 127).to(torch.int8), scale


@dataclass(frozen=True)
class CallStats:
    """One rank's view of one dispatch or combine.

    bytes_sent / bytes_received: what this rank sent to and received from the other ranks, from the
    routing the call exchanged (the count table): token rows (hidden x dtype bytes each; an int8
    dispatch's rows hidden rounded up to 32 plus 32 bytes: the row and its f32 scale, each padded
    to whole 32-byte blocks as every window row other ranks write is) and, for a
    dispatch, this rank's row of the count table (experts x 4 bytes) to each peer. Rows a rank routes
    to its own experts are local copies and not counted. measured_remote_write / _read: the bytes
    this rank's cores wrote to / read from other ranks' memory during the call, as the CPU model
    counted them (None where there are no counters, e.g. on an NPU)."""
    kind: str                  # "dispatch" or "combine"
    rank: int
    seq: int                   # the dispatch this call belongs to (1, 2, ...)
    us: float                  # host wall time of the call (checks, launch, kernel), microseconds
    tokens: int                # tokens this rank dispatched / got back
    rows_sent: int             # token rows to other ranks
    rows_received: int         # token rows from other ranks
    rows_local: int            # token rows between this rank and its own experts
    bytes_sent: int
    bytes_received: int
    measured_remote_write: int | None
    measured_remote_read: int | None

    def as_dict(self) -> dict:
        return asdict(self)


class DispatchHandle:
    """What combine needs from its dispatch: the buffer's routing state of that dispatch. A handle
    is valid until the buffer's next dispatch (combine refuses an older one)."""

    __slots__ = ("seq", "tokens", "num_recv_tokens_per_expert_list", "recv_rows_per_expert_and_rank",
                 "recv_rows", "recv_shape", "rows_from", "rows_to", "rows_local", "stats", "has_weights",
                 "active")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        live = "" if self.active is None else f", active={self.active}"
        return (f"DispatchHandle(seq={self.seq}, tokens={self.tokens}, recv_rows={self.recv_rows}, "
                f"per_expert={self.num_recv_tokens_per_expert_list}{live})")


class Buffer:
    """MoE dispatch and combine for one layer shape, DeepEP-style (see the module docstring and
    docs/api.md, "A DeepEP-style Buffer"). Create it on every rank with the same arguments; every
    rank calls dispatch and combine in the same order (they are collective)."""

    def __init__(self, comm=None, *, hidden: int, max_tokens: int, num_experts: int, topk: int,
                 dtype: torch.dtype = torch.bfloat16, max_recv: int | None = None,
                 low_latency_mode: bool = False, payload: torch.dtype | None = None,
                 schedules: str | Path | None = None, options=None,
                 trace: str | Path | None = None, timeout: float | None = None):
        for name, v in (("hidden", hidden), ("max_tokens", max_tokens), ("num_experts", num_experts),
                        ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise StrataUsageError(f"Buffer: {name} must be a positive int, got {v!r}")
        if dtype not in _TOKEN_DTYPES:
            raise StrataUsageError(f"Buffer: dtype must be one of {', '.join(map(str, _TOKEN_DTYPES))}, "
                                   f"got {dtype!r}")
        if topk > num_experts:
            raise StrataUsageError(f"Buffer: topk = {topk} is more than num_experts = {num_experts}")
        if payload == dtype:
            payload = None
        if payload not in (None, torch.int8):
            raise StrataUsageError(f"Buffer: payload must be None (rows travel in dtype) or torch.int8 (rows "
                                   f"quantised per token, with f32 scales), got {payload!r}")
        self.quantized = payload == torch.int8
        self.low_latency_mode = bool(low_latency_mode)
        if self.low_latency_mode and max_recv is not None:
            raise StrataUsageError("Buffer: max_recv is for the packed (prefill) window; the low-latency "
                                   "window holds max_tokens rows per (expert, source rank)")
        self._owns_comm = False
        if timeout is not None and not (comm is None or _is_process_group(comm)):
            raise StrataUsageError("Buffer: timeout is for the communicator the buffer makes from a process "
                                   "group; a Communicator passed in keeps its own "
                                   "(Communicator.from_process_group(..., timeout=...))")
        if comm is None or _is_process_group(comm):
            comm = self._communicator_for(comm, hidden, max_tokens, num_experts, topk, dtype, max_recv,
                                          timeout, self.low_latency_mode, payload)
        elif not all(hasattr(comm, a) for a in ("rank", "world", "load", "zeros", "barrier")):
            raise StrataUsageError(f"Buffer: comm must be a Communicator or NpuCommunicator, None or "
                                   f"a torch.distributed process group, got {type(comm).__name__}")
        self.comm = comm
        self.rank, self.world = comm.rank, comm.world
        if num_experts % self.world:
            raise StrataUsageError(f"Buffer: num_experts = {num_experts} must be a multiple of the world "
                                   f"size {self.world} (every rank holds num_experts / world experts)")
        max_recv = _window_rows(self.world, max_tokens, num_experts, topk, max_recv, self.low_latency_mode)
        if isinstance(max_recv, bool) or not isinstance(max_recv, int) or max_recv < 1:
            raise StrataUsageError(f"Buffer: max_recv must be a positive int (rows a rank may receive), "
                                   f"got {max_recv!r}")
        self.hidden, self.max_tokens, self.num_experts, self.topk = hidden, max_tokens, num_experts, topk
        self.dtype, self.max_recv = dtype, max_recv
        self.num_local_experts = num_experts // self.world
        self.local_experts = range(self.rank * self.num_local_experts,
                                   (self.rank + 1) * self.num_local_experts)
        self.payload = payload or dtype
        self.row_bytes = hidden * torch.empty(0, dtype=dtype).element_size()    # combine's rows
        # an int8 dispatch's window rows, padded to whole 32-byte blocks (ir.WINDOW_ROW_ALIGN: no
        # two ranks write one block of a peer's window), and its scale rows: 8 f32, the scale in
        # column 0; the caller sees the unpadded [rows, hidden] and [rows, 1]
        self.hidden_q = ir.padded_row(hidden, ir.DType.I8)
        self.dispatch_row_bytes = self.hidden_q + SCALE_COLS * 4 if self.quantized else self.row_bytes
        kw = {"options": options} if options is not None else {}
        _, dispatch, combine = SCHEDULES[self.low_latency_mode, self.quantized]
        self.module = comm.load(Path(schedules) if schedules is not None
                                else default_schedules(self.low_latency_mode, payload), **kw)
        for name in (dispatch, combine):
            if name not in self.module.schedules:
                raise StrataUsageError(f"Buffer: the schedules file has no schedule {name}")
        self._dispatch, self._combine = self.module[dispatch], self.module[combine]
        # the heap tensors, allocated once (collective: same order on every rank)
        self._x = comm.zeros(max_tokens, self.hidden_q if self.quantized else hidden, dtype=self.payload)
        self._ids = comm.zeros(max_tokens, topk, dtype=torch.int32)
        self._weights = comm.zeros(max_tokens, topk, dtype=torch.float32)
        self._counts = comm.zeros(self.world, num_experts, dtype=torch.int32)
        self._win = comm.zeros(max_recv, hidden, dtype=dtype)
        self._y = comm.zeros(max_tokens, hidden, dtype=dtype)
        self._extra: tuple = ()
        if self.quantized:      # the scales, the int8 window and its scales
            self._xs = comm.zeros(max_tokens, SCALE_COLS, dtype=torch.float32)
            self._wq = comm.zeros(max_recv, self.hidden_q, dtype=torch.int8)
            self._ws = comm.zeros(max_recv, SCALE_COLS, dtype=torch.float32)
            self._extra = (self._xs, self._wq, self._ws)
        self._seq = 0
        self._combined = 0               # the seq of the last combined dispatch
        self._last: dict[str, CallStats] = {}
        self._trace_dir = Path(trace) if trace is not None else None
        if self._trace_dir is not None:
            self._trace_dir.mkdir(parents=True, exist_ok=True)
            (self._trace_dir / f"rank{self.rank}.jsonl").write_text("")
        self._closed = False
        comm.barrier()                   # every rank's heap tensors exist (and are zero) before a call

    # ---- sizing
    @staticmethod
    def heap_bytes_needed(world: int, *, hidden: int, max_tokens: int, num_experts: int, topk: int,
                          dtype: torch.dtype = torch.bfloat16, max_recv: int | None = None,
                          low_latency_mode: bool = False, payload: torch.dtype | None = None) -> int:
        """The heap per rank a Buffer of these sizes allocates (plus room for the sync area): for a
        communicator made to hold it (Communicator.from_process_group(heap_bytes=...))."""
        elem = torch.empty(0, dtype=dtype).element_size()
        max_recv = _window_rows(world, max_tokens, num_experts, topk, max_recv, low_latency_mode)
        parts = [max_tokens * hidden * elem, max_tokens * topk * 4, max_tokens * topk * 4,
                 world * num_experts * 4, max_recv * hidden * elem, max_tokens * hidden * elem]
        if payload == torch.int8 and dtype != torch.int8:   # int8 rows instead of x; scales; int8 window
            hq = ir.padded_row(hidden, ir.DType.I8)
            parts[0] = max_tokens * hq
            parts += [max_tokens * SCALE_COLS * 4, max_recv * hq, max_recv * SCALE_COLS * 4]
        return sum(parts) + _ALLOC_SLACK * len(parts) + (1 << 20)

    def _communicator_for(self, group, hidden, max_tokens, num_experts, topk, dtype, max_recv, timeout,
                          low_latency_mode, payload):
        import torch.distributed as dist

        from stratac.host.comm import DEFAULT_TIMEOUT, Communicator
        if not dist.is_initialized():
            raise StrataUsageError("Buffer: torch.distributed is not initialised: call "
                                   "dist.init_process_group('gloo') first (or pass a Communicator)")
        if group is dist.group.WORLD:
            group = None
        need = self.heap_bytes_needed(dist.get_world_size(group), hidden=hidden, max_tokens=max_tokens,
                                      num_experts=num_experts, topk=topk, dtype=dtype, max_recv=max_recv,
                                      low_latency_mode=low_latency_mode, payload=payload)
        self._owns_comm = True
        return Communicator.from_process_group(heap_bytes=need, timeout=timeout or DEFAULT_TIMEOUT, group=group)

    # ---- the DeepEP-shaped calls
    def get_dispatch_layout(self, topk_idx: torch.Tensor, active=None):
        """(num_tokens_per_rank [world], num_tokens_per_expert [num_experts], is_token_in_rank
        [tokens, world] bool) of this rank's routing, computed on the host. Unlike DeepEP, a token
        routed to two experts of one rank is sent twice (one row per (token, expert)), so the rows a
        rank sends to rank r are num_tokens_per_expert summed over r's experts. With a mask of
        active ranks (as dispatch's `active=`), the entries of masked ranks' experts are dropped, as
        the masked dispatch drops them."""
        live = self._mask(self._dispatch, active)
        ids = self._check_ids(topk_idx, None)
        valid = ids >= 0
        if live is not None:
            dead = torch.tensor([not v for v in live])
            valid &= ~dead[torch.where(valid, ids.long(), 0) // self.num_local_experts]
        per_expert = torch.bincount(ids[valid].long(), minlength=self.num_experts).int()
        owner = torch.where(valid, ids.long() // self.num_local_experts, torch.full_like(ids.long(), -1))
        in_rank = torch.zeros(ids.shape[0], self.world, dtype=torch.bool)
        for r in range(self.world):
            in_rank[:, r] = (owner == r).any(dim=1)
        return in_rank.sum(dim=0).int(), per_expert, in_rank

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None = None,
                 *, active=None):
        """Sends each token to the ranks of its top-k experts (collective).

        x: [tokens, hidden] of the buffer's dtype, tokens <= max_tokens (may differ between ranks);
        topk_idx: [tokens, topk] int32/int64 expert ids, -1 for none; topk_weights: [tokens, topk]
        floating (kept for combine; may instead be given to combine).
        Returns (recv_x, num_recv_tokens_per_expert_list, handle): recv_x is a view of this rank's
        window, [rows, hidden], local expert l's rows after those of experts 0..l-1, each expert's
        rows from rank 0 first, then rank 1, ... (token order within a rank); it is valid until the
        next dispatch (in low-latency mode until the combine: peers' next dispatch writes without
        waiting). A routing that sends some rank more than max_recv rows raises
        StrataRuntimeError on every rank, with nothing written to any window.
        In low-latency mode recv_x is [num_local_experts, world * max_tokens, hidden], as DeepEP's
        low-latency dispatch: rank s's rows for local expert l at recv_x[l, s * max_tokens:][:c],
        c = handle.recv_rows_per_expert_and_rank[l][s] (the rows between are not data).
        With payload=torch.int8, x (in dtype) is quantised per token (quantize_per_token) and recv_x
        is (recv_x_q, recv_scales): int8 [rows, hidden] and f32 [rows, 1], row r's scale in row r
        (dequantised: recv_x_q.float() * recv_scales); both are views of windows whose rows are
        padded to whole 32-byte blocks (hidden rounded up to 32 int8 columns, 8 f32 scale columns),
        so neither is contiguous unless hidden is a multiple of 32; combine then takes y in dtype,
        [rows, hidden].
        active: a mask of live ranks, one entry per rank (as a schedule call's `active=`,
        docs/robustness.md "Masked ranks"): every live rank passes the same one, a masked rank does
        not call; entries of masked ranks' experts are dropped (not sent, not counted, weight 0 in
        combine), masked ranks are neither written nor waited for. The handle keeps the mask."""
        self._check_open()
        live = self._mask(self._dispatch, active)
        n = self._check_x(x)
        ids = self._check_ids(topk_idx, n)
        if topk_weights is not None:
            self._check_weights(topk_weights, n)
        self._seq += 1
        seq = self._seq
        if self.quantized:
            q, scale = quantize_per_token(x)
            self._x[:n, :self.hidden].copy_(q)
            self._xs[:n, :1].copy_(scale)
        else:
            self._x[:n].copy_(x)
        self._ids[:n].copy_(ids)
        self._ids[n:].fill_(-1)
        if topk_weights is not None:
            self._weights[:n].copy_(topk_weights)
        self._weights[n:].zero_()
        if self.quantized:
            call = lambda: self._dispatch(self._x, self._xs, self._ids, self._counts, self._wq, self._ws,  # noqa: E731
                                          active=live)
        else:
            call = lambda: self._dispatch(self._x, self._ids, self._counts, self._win, active=live)  # noqa: E731
        us, measured = self._timed(call, "dispatch", seq)
        counts = self._counts.long()
        if live is not None:      # a masked source's row is not written this call: it sent nothing
            counts = counts * torch.tensor(live, dtype=torch.long).unsqueeze(1)
        le = self.local_experts
        per_expert = [int(v) for v in counts[:, le.start:le.stop].sum(dim=0)]
        per_source = counts[:, le.start:le.stop].t().tolist()      # [local expert][source rank]
        ll = (self.num_local_experts, self.world * self.max_tokens)   # the low-latency layout
        if self.low_latency_mode and self.quantized:
            recv_x = (self._wq.view(*ll, self.hidden_q)[..., :self.hidden], self._ws.view(*ll, SCALE_COLS)[..., :1])
        elif self.low_latency_mode:
            recv_x = self._win.view(*ll, self.hidden)
        elif self.quantized:
            recv_x = (self._wq[:sum(per_expert), :self.hidden], self._ws[:sum(per_expert), :1])
        else:
            recv_x = self._win[:sum(per_expert)]
        mine = counts[:, le.start:le.stop].sum(dim=1)             # rows from each rank
        owners = counts.view(self.world, self.world, self.num_local_experts).sum(dim=2)
        to = owners[self.rank]                                      # rows to each rank
        rows_local = int(to[self.rank])
        rows_to, rows_from = int(to.sum()) - rows_local, int(mine.sum()) - int(mine[self.rank])
        peers = (self.world if live is None else sum(live)) - 1
        table = peers * self.num_experts * 4                        # my count row to every live peer
        stats = CallStats("dispatch", self.rank, seq, us, n, rows_to, rows_from, rows_local,
                          rows_to * self.dispatch_row_bytes + table, rows_from * self.dispatch_row_bytes + table,
                          *measured)
        self._last = {"dispatch": stats}
        self._record(stats)
        handle = DispatchHandle(seq=seq, tokens=n, num_recv_tokens_per_expert_list=per_expert,
                                recv_rows_per_expert_and_rank=per_source, recv_rows=sum(per_expert),
                                recv_shape=tuple(recv_x[0].shape) if self.quantized else tuple(recv_x.shape),
                                rows_from=rows_from, rows_to=rows_to,
                                rows_local=rows_local, stats=stats, has_weights=topk_weights is not None,
                                active=live)
        return recv_x, per_expert, handle

    def combine(self, y: torch.Tensor, handle: DispatchHandle,
                topk_weights: torch.Tensor | None = None, *, active=None) -> torch.Tensor:
        """Brings the experts' outputs back to their tokens' ranks and sums them (collective):
        returns a new [tokens, hidden] tensor, out[t] = sum_k topk_weights[t, k] * y[row of (t, k)]
        (f32 accumulation), 0 for a token routed nowhere. y: [rows, hidden] in recv_x's layout
        (recv_x itself may be passed, after the experts wrote their outputs into it);
        topk_weights: the dispatch's unless given here. active: the dispatch's mask (kept in the
        handle) when None; a mask given here must be that one."""
        self._check_open()
        if not isinstance(handle, DispatchHandle):
            raise StrataUsageError(f"combine: handle must be the DispatchHandle dispatch returned, got "
                                   f"{type(handle).__name__}")
        if handle.seq != self._seq:
            raise StrataUsageError(f"combine: handle belongs to dispatch {handle.seq}, but the buffer has "
                                   f"dispatched since (dispatch {self._seq}): combine each dispatch before "
                                   "the next one")
        if handle.seq == self._combined:
            raise StrataUsageError(f"combine: dispatch {handle.seq} was already combined (its window holds "
                                   "the previous outputs); dispatch again")
        if active is not None:
            live = self._mask(self._combine, active)
            if live != handle.active:
                raise StrataUsageError(f"combine: active = {_fmt_mask(live)} differs from the "
                                       f"dispatch's mask {_fmt_mask(handle.active)}: a combine "
                                       "runs on the ranks of its dispatch (pass the same mask, or none)")
        self._check_y(y, handle.recv_shape)
        if topk_weights is not None:
            self._check_weights(topk_weights, handle.tokens)
        elif not handle.has_weights:
            raise StrataUsageError("combine: topk_weights is required: the dispatch was given none")
        win = self._win.view(handle.recv_shape) if self.low_latency_mode else self._win[:handle.recv_rows]
        if win.numel() and y.data_ptr() != win.data_ptr():
            win.copy_(y)
        if topk_weights is not None:
            self._weights[:handle.tokens].copy_(topk_weights)
        us, measured = self._timed(lambda: self._combine(self._win, self._ids, self._weights, self._counts,
                                                         self._y, active=handle.active), "combine",
                                   handle.seq)
        self._combined = handle.seq
        stats = CallStats("combine", self.rank, handle.seq, us, handle.tokens, handle.rows_from,
                          handle.rows_to, handle.rows_local, handle.rows_from * self.row_bytes,
                          handle.rows_to * self.row_bytes, *measured)
        self._last["combine"] = stats
        self._record(stats)
        return self._y[:handle.tokens].clone()

    # ---- statistics and trace
    def last_stats(self) -> dict[str, CallStats]:
        """This rank's stats of the last dispatch and (if it has run) its combine."""
        return dict(self._last)

    def stats(self, all_ranks: bool = False):
        """last_stats(); with all_ranks=True (collective, needs torch.distributed), every rank's:
        {"dispatch": [CallStats of rank 0, 1, ...], "combine": [...]}, to find the slow rank."""
        mine = self.last_stats()
        if not all_ranks:
            return mine
        import torch.distributed as dist
        if not dist.is_initialized():
            raise StrataUsageError("stats(all_ranks=True) gathers over torch.distributed, which is not "
                                   "initialised")
        got: list = [None] * self.world
        dist.all_gather_object(got, {k: v.as_dict() for k, v in mine.items()})
        out: dict[str, list[CallStats]] = {}
        for kind in ("dispatch", "combine"):
            if all(kind in g for g in got):
                out[kind] = [CallStats(**g[kind]) for g in got]
        return out

    def _timed(self, call, kind: str, seq: int):
        lib = getattr(self.comm, "_lib", None)
        counting = lib is not None and hasattr(lib, "strata_cpu_read_counters")   # the CPU model
        before = _remote(self.comm) if counting else None
        tracing = self._trace_dir is not None and hasattr(lib, "strata_cpu_trace_enable")
        if tracing:
            lib.strata_cpu_trace_enable(1)
        t0 = time.monotonic()            # CLOCK_MONOTONIC: the CPU model's trace clock
        try:
            call()
            self.comm.synchronize()
        finally:
            t1 = time.monotonic()
            if tracing:
                lib.strata_cpu_trace_enable(0)
        if tracing:
            path = self._trace_dir / f"rank{self.rank}.jsonl"
            if lib.strata_cpu_trace_write(str(path).encode()) != 0:
                from stratac.host.cpu_model import last_error
                raise StrataRuntimeError(f"Buffer: writing the trace {path} on rank {self.rank}: "
                                         f"{last_error(lib, self.comm._ffi)}")
        self._t = (t0, t1)
        us = (t1 - t0) * 1e6
        if before is None:
            return us, (None, None)
        after = _remote(self.comm)
        return us, (after[0] - before[0], after[1] - before[1])

    def _record(self, stats: CallStats) -> None:
        if self._trace_dir is None:
            return
        t0, t1 = self._t
        with open(self._trace_dir / f"rank{self.rank}.jsonl", "a") as f:
            f.write(json.dumps({"ph": "X", "pid": self.rank, "tid": HOST_TID, "ts": t0 * 1e6,
                                "dur": (t1 - t0) * 1e6, "name": f"{stats.kind} {stats.seq}",
                                "cat": "moe", "args": stats.as_dict()}) + "\n")

    def write_trace(self, path: str | Path) -> Path | None:
        """Merges every rank's spans into one Chrome/Perfetto trace (collective; rank 0 writes it):
        a process per rank, the host's span of each dispatch and combine with its stats as args,
        and on the CPU model the cores' and SDMA queues' spans. Needs Buffer(..., trace=DIR)."""
        if self._trace_dir is None:
            raise StrataUsageError("write_trace: the buffer was created without trace=DIR")
        self.comm.barrier()
        out = None
        if self.rank == 0:
            events = []
            for r in range(self.world):
                f = self._trace_dir / f"rank{r}.jsonl"
                if f.is_file():
                    events += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            t0 = min((e["ts"] for e in events), default=0.0)
            meta = []
            for e in events:
                e["ts"] = round(e["ts"] - t0, 3)
            for pid, tid in sorted({(e["pid"], e["tid"]) for e in events}):
                name = ("dispatch/combine (host)" if tid == HOST_TID else
                        f"sdma queue {tid - 1000}" if tid >= 1000 else f"core {tid}")
                meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                             "args": {"name": name}})
            for pid in sorted({e["pid"] for e in events}):
                meta.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {pid}"}})
            out = Path(path)
            out.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms",
                                       "otherData": {"stratac": "Buffer dispatch/combine",
                                                     "world": self.world}}) + "\n")
        self.comm.barrier()
        return out

    # ---- checks
    def _mask(self, schedule, active) -> list[bool] | None:
        """One bool per rank (None: every rank) of an `active=`, checked as the schedule call
        checks it (Schedule.active_bits: length, type, values, this rank live, world <= 64)."""
        bits = schedule.active_bits(active)
        return None if bits == ALL_RANKS else [bool(bits >> r & 1) for r in range(self.world)]

    def _check_open(self) -> None:
        if self._closed:
            raise StrataUsageError("the Buffer is closed")

    def _device_check(self, t: torch.Tensor, name: str) -> None:
        if t.device != self._x.device:
            raise StrataUsageError(f"{name} is on {t.device}, but the buffer's heap is on {self._x.device}")

    def _check_x(self, x) -> int:
        if not isinstance(x, torch.Tensor):
            raise StrataUsageError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise StrataUsageError(f"x must have shape [tokens, {self.hidden}] (hidden = {self.hidden}), "
                                   f"got {list(x.shape)}")
        if x.dtype != self.dtype:
            raise StrataUsageError(f"x must be {self.dtype} (the buffer's dtype), got {x.dtype}")
        self._device_check(x, "x")
        if x.shape[0] > self.max_tokens:
            raise StrataUsageError(f"x has {x.shape[0]} tokens, more than max_tokens = {self.max_tokens} "
                                   "the buffer was created for")
        return int(x.shape[0])

    def _check_y(self, y, shape: tuple) -> None:
        if not isinstance(y, torch.Tensor):
            raise StrataUsageError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if tuple(y.shape) != shape:
            raise StrataUsageError(f"y must have shape {list(shape)} (recv_x's: the rows this rank received "
                                   f"in the dispatch), got {list(y.shape)}")
        if y.dtype != self.dtype:
            raise StrataUsageError(f"y must be {self.dtype} (the buffer's dtype), got {y.dtype}")
        self._device_check(y, "y")

    def _check_ids(self, ids, n: int | None) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise StrataUsageError(f"topk_idx must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2 or ids.shape[1] != self.topk or (n is not None and ids.shape[0] != n):
            raise StrataUsageError(f"topk_idx must have shape [{'tokens' if n is None else n}, {self.topk}] "
                                   f"(x's tokens, topk = {self.topk}), got {list(ids.shape)}")
        if ids.dtype not in (torch.int32, torch.int64):
            raise StrataUsageError(f"topk_idx must be int32 or int64, got {ids.dtype}")
        self._device_check(ids, "topk_idx")
        if n is None and ids.shape[0] > self.max_tokens:
            raise StrataUsageError(f"topk_idx has {ids.shape[0]} tokens, more than max_tokens = "
                                   f"{self.max_tokens}")
        bad = (ids < -1) | (ids >= self.num_experts)
        if bool(bad.any()):
            at = tuple(int(v) for v in bad.nonzero()[0])
            raise StrataUsageError(f"topk_idx[{at[0]}, {at[1]}] = {int(ids[at])} is not an expert: it must "
                                   f"lie in [0, {self.num_experts}) or be -1 (none); nothing was sent")
        return ids

    def _check_weights(self, w, n: int) -> None:
        if not isinstance(w, torch.Tensor):
            raise StrataUsageError(f"topk_weights must be a torch.Tensor, got {type(w).__name__}")
        if list(w.shape) != [n, self.topk]:
            raise StrataUsageError(f"topk_weights must have shape [{n}, {self.topk}] (like topk_idx), got "
                                   f"{list(w.shape)}")
        if not w.dtype.is_floating_point:
            raise StrataUsageError(f"topk_weights must be floating point (float32 is used), got {w.dtype}")
        self._device_check(w, "topk_weights")
        if not bool(torch.isfinite(w).all()):
            raise StrataUsageError("topk_weights has a NaN or infinite value")

    # ---- end
    def close(self) -> None:
        """Frees the heap tensors (collective), and closes the communicator if the buffer made it."""
        if self._closed:
            return
        self._closed = True
        for t in (*reversed(self._extra), self._y, self._win, self._counts, self._weights, self._ids, self._x):
            self.comm.free(t)
        if self._owns_comm:
            self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _window_rows(world: int, max_tokens: int, num_experts: int, topk: int, max_recv: int | None,
                 low_latency_mode: bool) -> int | None:
    """The rows of a rank's window: in low-latency mode max_tokens per (expert, source rank);
    else max_recv, by default the most any routing sends (every rank's every entry)."""
    if low_latency_mode:
        return num_experts * max_tokens
    return world * max_tokens * topk if max_recv is None else max_recv


def _is_process_group(obj) -> bool:
    try:
        import torch.distributed as dist
        return isinstance(obj, dist.ProcessGroup)
    except (ImportError, AttributeError):
        return False


def _fmt_mask(live: list[bool] | None) -> str:
    return "every rank" if live is None else "[" + ", ".join("1" if v else "0" for v in live) + "]"


def _remote(comm) -> tuple[int, int]:
    """(remote_write, remote_read) bytes over this rank's cores since the counters were reset."""
    cs = comm.counters()
    return sum(c["remote_write"] for c in cs), sum(c["remote_read"] for c in cs)


__all__ = ["Buffer", "CallStats", "DispatchHandle", "default_schedules", "quantize_per_token"]
