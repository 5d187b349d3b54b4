"""A DeepEP drop-in: `deep_ep.Buffer`'s constructor, methods, argument names, defaults and return
tuples, on stratac's proven MoE schedules. A DeepEP script changes one line:

    from stratac import deep_ep          # instead of: import deep_ep

In: what DeepEP's Buffer takes (a process group; per call tokens, top-k expert ids and weights).
Out: what it returns, with DeepEP's semantics (docs/deep_ep.md lists every difference that remains):

* normal mode: `get_dispatch_layout`, `dispatch` (a token sent once to each rank that owns one of
  its experts; rows grouped by source rank in token order; `recv_topk_idx` local ids or -1,
  `recv_topk_weights` 0 where not local; per-expert counts rounded up to `expert_alignment`;
  `num_worst_tokens`; cached dispatch with a handle) and `combine` (the *unweighted* sum of a
  token's copies, plus `bias`; `topk_weights` summed the same way);
* low-latency mode: `low_latency_dispatch` (recv_x [num_local_experts, ranks * M, hidden], each
  expert's rows packed from row 0, ranges per source rank in the handle's layout, `recv_count`) and
  `low_latency_combine` (the weighted sum over the top-k, skipping -1).

Normal mode runs stratac.host.moe.Buffer with one "expert" per rank (a token's ids become the
distinct ranks of its experts), so each token crosses to a rank once; its top-k ids, weights and
index travel in a second dispatch of f32 rows over the same routing. Low-latency mode runs the
Buffer's decode schedules (fixed slots per (expert, source rank)) and packs each expert's rows.
Both size their buffers from the first call's shapes (one per hidden, dtype and top-k).

Calls are synchronous on the CPU target: every `EventOverlap` returned is complete, `hook()` has
nothing left to wait for (it must still be called before the results are used, as on DeepEP).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stratac.host.errors import StrataUsageError
from stratac.host.moe import Buffer as _MoeBuffer

topk_idx_t = torch.int64
_META_ALIGN = 8          # f32 columns of a metadata row: whole 32-byte blocks (window rows)
_TOKEN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass
class Config:
    """DeepEP's tuning config. Accepted for compatibility; stratac partitions work over the vector
    cores by bytes itself, so it changes nothing."""
    num_sms: int = 20
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256


class EventOverlap:
    """DeepEP's event wrapper. Every call is complete when it returns on the CPU target, so the event
    is None and waiting on it does nothing (as DeepEP's own with async_finish=False)."""

    def __init__(self, event=None, extra_tensors: tuple | None = None):
        self.event, self.extra_tensors = event, extra_tensors

    def current_stream_wait(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Handle(tuple):
    """DeepEP's handle tuple (normal: rank_prefix_matrix, channel_prefix_matrix (None),
    recv_channel_prefix_matrix (None), recv_src_idx, is_token_in_rank, send_head (None); low latency:
    src_info, layout_range, M, hidden, num_experts), carrying stratac's state of the call."""

    def __new__(cls, items, **state):
        h = super().__new__(cls, items)
        h.state = state
        return h


class Buffer:
    """deep_ep.Buffer. Collective: every rank of `group` constructs it and makes the same calls."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 use_fabric: bool = False, explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm=None, *, payload: torch.dtype | None = None, timeout: float | None = None):
        import torch.distributed as dist
        if comm is not None:
            raise StrataUsageError("deep_ep.Buffer: comm (an mpi4py communicator) is not supported: pass a "
                                   "torch.distributed process group")
        if not dist.is_initialized():
            raise StrataUsageError("deep_ep.Buffer: torch.distributed is not initialised: call "
                                   "dist.init_process_group first")
        if num_rdma_bytes and not low_latency_mode:
            raise StrataUsageError(f"deep_ep.Buffer: num_rdma_bytes = {num_rdma_bytes} asks for an RDMA buffer "
                                   "for inter-node normal mode; stratac's ranks share one supernode's pooled "
                                   "memory and have no RDMA path (pass num_rdma_bytes=0)")
        if enable_shrink:
            raise StrataUsageError("deep_ep.Buffer: enable_shrink is not supported; stratac.Buffer masks ranks "
                                   "per call instead (active=, docs/api.md)")
        if payload not in (None, torch.int8):
            raise StrataUsageError(f"deep_ep.Buffer: payload must be None or torch.int8, got {payload!r}")
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.group_size = dist.get_rank(group), dist.get_world_size(group)
        self.num_nvl_bytes, self.num_rdma_bytes = int(num_nvl_bytes), int(num_rdma_bytes)
        self.low_latency_mode, self.explicitly_destroy = bool(low_latency_mode), bool(explicitly_destroy)
        self.enable_shrink = False
        self.payload, self.timeout = payload, timeout
        self._inner: dict[tuple, _MoeBuffer] = {}
        self._caps: dict[tuple, int] = {}   # tokens per normal-mode call shape (_capacity)
        self._pending_hook = None       # a recv hook returned and not yet called
        self._destroyed = False

    # ---- DeepEP's static helpers
    @staticmethod
    def is_sm90_compiled() -> bool:
        return False

    @classmethod
    def set_num_sms(cls, new_num_sms: int) -> None:
        if new_num_sms % 2:
            raise StrataUsageError(f"set_num_sms: {new_num_sms} must be even (as DeepEP asserts)")
        cls.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        return EventOverlap()

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """The heap per rank low-latency calls of these sizes use (bf16, top-k up to 16): what to pass
        as num_rdma_bytes (stratac sizes its buffers from the calls; the value is not needed)."""
        return _MoeBuffer.heap_bytes_needed(num_ranks, hidden=hidden, max_tokens=num_max_dispatch_tokens_per_rank,
                                            num_experts=num_experts, topk=min(16, num_experts),
                                            low_latency_mode=True)

    def get_local_buffer_tensor(self, *args, **kwargs):
        raise StrataUsageError("get_local_buffer_tensor: stratac has no raw NVLink buffer; its windows are "
                               "the Buffer's heap tensors, returned by dispatch")

    def get_comm_stream(self):
        raise StrataUsageError("get_comm_stream: calls are synchronous on the CPU target (no streams)")

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Nothing to clean: stratac's flags are stamped with the call's epoch, so a stale flag of an
        earlier call never satisfies a wait."""

    def destroy(self) -> None:
        if not self.explicitly_destroy:
            raise StrataUsageError("destroy: the buffer was made with explicitly_destroy=False (as DeepEP "
                                   "asserts); it is released with the process")
        self._close()

    def _close(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        for inner in self._inner.values():
            inner.close()
        self._inner.clear()

    # ---- checks shared by the calls
    def _check_alive(self) -> None:
        if self._destroyed:
            raise StrataUsageError("the buffer was destroyed")
        if self._pending_hook is not None:
            raise StrataUsageError(f"the recv hook of {self._pending_hook} was never called: call hook() "
                                   "before using its results and before the next call")

    def _check_topk(self, topk_idx, num_experts: int, tokens: int | None) -> torch.Tensor:
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2:
            raise StrataUsageError(f"topk_idx must be a 2-D tensor [tokens, num_topk], got "
                                   f"{getattr(topk_idx, 'shape', type(topk_idx).__name__)}")
        if topk_idx.dtype not in (torch.int64, torch.int32):
            raise StrataUsageError(f"topk_idx must be {topk_idx_t} (deep_ep.topk_idx_t) or int32, got "
                                   f"{topk_idx.dtype}")
        if tokens is not None and topk_idx.shape[0] != tokens:
            raise StrataUsageError(f"topk_idx has {topk_idx.shape[0]} rows, x has {tokens} tokens")
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise StrataUsageError(f"num_experts must be a positive int, got {num_experts!r}")
        if num_experts % self.group_size:
            raise StrataUsageError(f"num_experts = {num_experts} is not divisible by the {self.group_size} ranks "
                                   "(every rank holds num_experts / ranks experts)")
        bad = (topk_idx < -1) | (topk_idx >= num_experts)
        if bool(bad.any()):
            t, k = (int(v) for v in bad.nonzero()[0])
            raise StrataUsageError(f"topk_idx[{t}, {k}] = {int(topk_idx[t, k])} is not an expert: it must lie "
                                   f"in [0, {num_experts}) or be -1; nothing was sent")
        return topk_idx

    @staticmethod
    def _check_weights(w, shape) -> torch.Tensor:
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != tuple(shape):
            raise StrataUsageError(f"topk_weights must be a tensor of shape {list(shape)}, got "
                                   f"{getattr(w, 'shape', type(w).__name__)}")
        if not w.dtype.is_floating_point:
            raise StrataUsageError(f"topk_weights must be float32, got {w.dtype}")
        if not bool(torch.isfinite(w).all()):
            t, k = (int(v) for v in (~torch.isfinite(w)).nonzero()[0])
            raise StrataUsageError(f"topk_weights[{t}, {k}] = {float(w[t, k])}: a weight must be finite; "
                                   "nothing was sent")
        return w

    def _check_x(self, x) -> torch.Tensor:
        if isinstance(x, tuple):
            raise StrataUsageError("x is a tuple (fp8 rows and their scales): stratac has no fp8 e4m3 (A2/A3 "
                                   "vector units compute no fp8); make the buffer with payload=torch.int8 and "
                                   "pass x in bf16: it is quantised per token to int8 with f32 scales")
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise StrataUsageError(f"x must be a 2-D tensor [tokens, hidden], got "
                                   f"{getattr(x, 'shape', type(x).__name__)}")
        if x.dtype not in _TOKEN_DTYPES:
            raise StrataUsageError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
        return x

    def _buffer(self, key: tuple, **kw) -> _MoeBuffer:
        """The stratac Buffer of a call shape, made at its first call and again when the ranks agreed
        on more tokens than it holds (collective, like the call)."""
        inner = self._inner.get(key)
        if inner is not None and inner.max_tokens < kw["max_tokens"]:   # the ranks agreed to grow it
            inner.close()
            inner = None
        if inner is None:
            inner = self._inner[key] = _MoeBuffer(self._torch_group(), timeout=self.timeout, **kw)
        return inner

    def _capacity(self, key: tuple, tokens: int) -> int:
        """The tokens the normal-mode buffers of a call shape hold: the most any rank dispatches in
        this call (an all-reduce over the group: ranks dispatch different numbers of tokens, and
        every rank must use the same buffers), rounded up to a power of two, kept while it fits."""
        import torch.distributed as dist
        most = torch.tensor([tokens], dtype=torch.int32)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self._torch_group())
        cap = self._caps.get(key, 0)
        if int(most) > cap:
            cap = self._caps[key] = 1 << max(6, (int(most) - 1).bit_length())
        return cap

    def _torch_group(self):
        return None if self.group is torch.distributed.group.WORLD else self.group

    # ---- normal mode
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """(num_tokens_per_rank [ranks] int32, None (one supernode: no RDMA ranks), num_tokens_per_expert
        [num_experts] int32, is_token_in_rank [tokens, ranks] bool, event). Computed on the host."""
        ids = self._check_topk(topk_idx, num_experts, None)
        local = num_experts // self.group_size
        valid = ids >= 0
        per_expert = torch.bincount(ids[valid].long(), minlength=num_experts).int()
        owner = torch.where(valid, ids.long() // local, torch.full_like(ids.long(), -1))
        in_rank = (owner.unsqueeze(2) == torch.arange(self.group_size).view(1, 1, -1)).any(dim=1)
        return in_rank.sum(dim=0).int(), None, per_expert, in_rank, EventOverlap()

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment: int = 1, num_worst_tokens: int = 0, config=None, previous_event=None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)."""
        self._check_alive()
        if self.low_latency_mode:
            raise StrataUsageError("dispatch: the buffer is in low-latency mode: use low_latency_dispatch")
        x = self._check_x(x)
        if handle is not None:
            return self._cached_dispatch(x, handle)
        if topk_idx is None:
            raise StrataUsageError("dispatch: topk_idx is required (stratac routes by expert ids; the layout "
                                   "arguments alone are not enough)")
        if isinstance(expert_alignment, bool) or not isinstance(expert_alignment, int) or expert_alignment < 1:
            raise StrataUsageError(f"expert_alignment must be a positive int, got {expert_alignment!r}")
        n, hidden = x.shape
        num_experts = _num_experts(num_tokens_per_expert)
        ids = self._check_topk(topk_idx, num_experts, n)
        topk = ids.shape[1]
        if topk_weights is not None:
            self._check_weights(topk_weights, ids.shape)
        local = num_experts // self.group_size
        _, _, _, in_rank, _ = self.get_dispatch_layout(ids, num_experts)
        kr = min(topk, self.group_size)
        # a token's destination ranks, in rank order, padded with -1: one "expert" per rank
        order = torch.where(in_rank, torch.arange(self.group_size), self.group_size + torch.arange(self.group_size))
        ranks = order.sort(dim=1).values[:, :kr]
        rank_ids = torch.where(ranks < self.group_size, ranks, torch.full_like(ranks, -1)).int()
        ones = (rank_ids >= 0).float()
        cap = self._capacity(("normal", hidden, x.dtype, kr), n)
        tok = self._buffer(("normal", hidden, x.dtype, kr), hidden=hidden, max_tokens=cap, num_experts=self.group_size, topk=kr,
                           dtype=x.dtype, max_recv=self.group_size * cap, payload=self.payload)
        width = -(-(2 * topk + 1) // _META_ALIGN) * _META_ALIGN
        meta_buf = self._buffer(("meta", width, kr), hidden=width, max_tokens=cap,
                                num_experts=self.group_size, topk=kr, dtype=torch.float32,
                                max_recv=self.group_size * cap)
        recv_x, _, tok_handle = tok.dispatch(x, rank_ids, ones)
        meta = torch.zeros(n, width)
        meta[:, :topk] = ids.float()
        if topk_weights is not None:
            meta[:, topk:2 * topk] = topk_weights.float()
        meta[:, 2 * topk] = torch.arange(n, dtype=torch.float32)
        recv_meta, _, meta_handle = meta_buf.dispatch(meta, rank_ids, ones)
        got = recv_meta[:, :topk].long()
        mine = (got >= self.rank * local) & (got < (self.rank + 1) * local)
        recv_topk_idx = torch.where(mine, got - self.rank * local, torch.full_like(got, -1)).to(ids.dtype)
        recv_topk_weights = (torch.where(mine, recv_meta[:, topk:2 * topk], torch.zeros(()))
                             if topk_weights is not None else None)
        counts = torch.bincount(recv_topk_idx[recv_topk_idx >= 0].long(), minlength=local).tolist()
        per_expert = [-(-c // expert_alignment) * expert_alignment for c in counts]
        prefix = _rank_prefix(tok)
        recv_src_idx = recv_meta[:, 2 * topk].int()
        h = _Handle((prefix, None, None, recv_src_idx, in_rank, None), owner=self, kind="normal",
                    tok=tok, tok_handle=tok_handle, meta=meta_buf, meta_handle=meta_handle, rank_ids=rank_ids,
                    ones=ones, tokens=n, topk=topk, width=width, combined=False, meta_rows=meta, rows=None)
        recv_x = _own_copy(recv_x)
        if num_worst_tokens:
            rows = recv_topk_idx.shape[0]
            if num_worst_tokens < rows:
                raise StrataUsageError(f"dispatch: num_worst_tokens = {num_worst_tokens} is less than the {rows} "
                                       "tokens received")
            pad = num_worst_tokens - rows
            recv_x = _pad_rows(recv_x, pad)
            recv_topk_idx = torch.cat([recv_topk_idx, recv_topk_idx.new_full((pad, topk), -1)])
            if recv_topk_weights is not None:
                recv_topk_weights = _pad_rows(recv_topk_weights, pad)
            h = _Handle((prefix, None, None, torch.cat([recv_src_idx, recv_src_idx.new_full((pad,), -1)]), in_rank,
                         None), **{**h.state, "rows": rows})
            per_expert = []
        return recv_x, recv_topk_idx, recv_topk_weights, per_expert, h, EventOverlap()

    def _cached_dispatch(self, x, handle):
        """Dispatch with a handle's layout (DeepEP's cached mode): the same routing, for both the rows
        and their metadata, so that a weighted combine of the handle works again."""
        st = self._own(handle, "normal", "dispatch")
        recv_x, _, st["tok_handle"] = st["tok"].dispatch(x, st["rank_ids"], st["ones"])
        _, _, st["meta_handle"] = st["meta"].dispatch(st["meta_rows"], st["rank_ids"], st["ones"])
        st["combined"] = False
        recv_x = _own_copy(recv_x)
        if st["rows"] is not None:
            recv_x = _pad_rows(recv_x, len(handle[3]) - st["rows"])
        return recv_x, None, None, None, None, EventOverlap()

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (combined_x, combined_topk_weights, event): each token's copies summed without weights
        (plus bias); topk_weights [recv rows, topk] summed the same way."""
        self._check_alive()
        st = self._own(handle, "normal", "combine")
        if st["combined"]:
            raise StrataUsageError("combine: this handle's dispatch was already combined; a handle combines once")
        if st["rows"] is not None:           # num_worst_tokens: the rows past the received ones are padding
            x = x[:st["rows"]]
            topk_weights = topk_weights[:st["rows"]] if topk_weights is not None else None
        out = st["tok"].combine(x, st["tok_handle"])
        if bias is not None:
            for b in (bias if isinstance(bias, tuple) else (bias,)):
                if tuple(b.shape) != tuple(out.shape):
                    raise StrataUsageError(f"combine: bias must be {list(out.shape)}, got {list(b.shape)}")
                out = out + b.to(out.dtype)
        combined_w = None
        if topk_weights is not None:
            rows = st["meta_handle"].recv_rows
            self._check_weights(topk_weights, (rows, st["topk"]))
            w = torch.zeros(rows, st["width"])
            w[:, st["topk"]:2 * st["topk"]] = topk_weights.float()
            combined_w = st["meta"].combine(w, st["meta_handle"])[:, st["topk"]:2 * st["topk"]]
        st["combined"] = True
        return out, combined_w, EventOverlap()

    def _own(self, handle, kind: str, what: str) -> dict:
        st = getattr(handle, "state", None)
        if not isinstance(handle, _Handle) or st.get("owner") is not self:
            raise StrataUsageError(f"{what}: the handle is not one this buffer's dispatch returned")
        if st["kind"] != kind:
            raise StrataUsageError(f"{what}: the handle is a {st['kind']}-mode handle")
        return st

    # ---- low-latency mode
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """-> (recv_x [num_local_experts, ranks * M, hidden], recv_count [num_local_experts] int32, handle,
        event, hook). Each expert's rows are packed from row 0; the handle's layout_range[e][s] =
        (begin << 32) | count of the rows from rank s, src_info their token index on rank s. A buffer
        made with payload=torch.int8 quantises x per token and returns recv_x as (int8 rows
        [num_local_experts, ranks * M, hidden], f32 scales [num_local_experts, ranks * M, 1]), as
        DeepEP returns fp8 rows with their scales (use_fp8 stays False: the rows are int8)."""
        self._check_alive()
        if not self.low_latency_mode:
            raise StrataUsageError("low_latency_dispatch: the buffer was made with low_latency_mode=False")
        if use_fp8 or round_scale or use_ue8m0:
            raise StrataUsageError("low_latency_dispatch: use_fp8=True: stratac has no fp8 e4m3 (A2/A3 vector "
                                   "units compute no fp8); pass use_fp8=False, and make the buffer with "
                                   "payload=torch.int8 for int8 rows with f32 scales")
        if async_finish and return_recv_hook:
            raise StrataUsageError("low_latency_dispatch: async_finish and return_recv_hook exclude each other "
                                   "(as in DeepEP)")
        x = self._check_x(x)
        m = num_max_dispatch_tokens_per_rank
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise StrataUsageError(f"num_max_dispatch_tokens_per_rank must be a positive int, got {m!r}")
        n, hidden = x.shape
        if n > m:
            raise StrataUsageError(f"low_latency_dispatch: x has {n} tokens, more than "
                                   f"num_max_dispatch_tokens_per_rank = {m}; nothing was sent")
        ids = self._check_topk(topk_idx, num_experts, n)
        topk = ids.shape[1]
        local = num_experts // self.group_size
        inner = self._buffer(("ll", hidden, x.dtype, topk, m, num_experts), hidden=hidden, max_tokens=m,
                             num_experts=num_experts, topk=topk, dtype=x.dtype, low_latency_mode=True,
                             payload=self.payload)
        window, _, ih = inner.dispatch(x, ids)
        windows = window if isinstance(window, tuple) else (window,)   # int8: (rows, scales)
        per_source = ih.recv_rows_per_expert_and_rank               # [local expert][source rank]
        everyone = _all_gather_ids(ids, self.group, self.group_size, m)
        packed = tuple(torch.empty(local, self.group_size * m, w.shape[2], dtype=w.dtype) for w in windows)
        src_info = torch.full((local, self.group_size * m), -1, dtype=torch.int32)
        layout = torch.zeros(local, self.group_size, dtype=torch.int64)
        for e in range(local):
            at, expert = 0, self.rank * local + e
            for s in range(self.group_size):
                c = per_source[e][s]
                for p, w in zip(packed, windows):
                    p[e, at:at + c] = w[e, s * m:s * m + c]
                src_info[e, at:at + c] = (everyone[s] == expert).nonzero()[:, 0].int()[:c]
                layout[e, s] = (at << 32) | c
                at += c
        packed = packed if isinstance(window, tuple) else packed[0]
        recv_count = torch.tensor([sum(r) for r in per_source], dtype=torch.int32)
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats += recv_count.to(cumulative_local_expert_recv_stats.dtype)
        h = _Handle((src_info, layout, m, hidden, num_experts), owner=self, kind="ll", inner=inner, inner_handle=ih,
                    layout=layout, ids=ids, combined=False)
        hook = None
        if return_recv_hook:
            self._pending_hook = "low_latency_dispatch"
            hook = self._hook()
        return packed, recv_count, h, EventOverlap(), hook

    def _hook(self):
        def hook() -> None:
            """Completes the receive: on the CPU target the rows have arrived already."""
            self._pending_hook = None
        return hook

    def get_next_low_latency_combine_buffer(self, handle):
        st = self._own(handle, "ll", "get_next_low_latency_combine_buffer")
        src_info, _, m, hidden, _ = handle
        if "zero" not in st:
            st["zero"] = torch.empty(src_info.shape[0], self.group_size * m, hidden, dtype=st["inner"].dtype)
        return st["zero"]

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out=None, combine_wait_recv_cost_stats=None):
        """-> (combined_x [tokens, hidden], event, hook): out[t] = sum over k with topk_idx[t, k] != -1 of
        topk_weights[t, k] * the expert's row of (t, k), accumulated in f32."""
        self._check_alive()
        st = self._own(handle, "ll", "low_latency_combine")
        if st["combined"]:
            raise StrataUsageError("low_latency_combine: this handle was already combined; a handle combines once")
        if use_logfmt:
            raise StrataUsageError("low_latency_combine: use_logfmt (DeepEP's 10-bit transfer format) is not "
                                   "supported; rows travel in the buffer's dtype")
        inner, ih = st["inner"], st["inner_handle"]
        src = st.get("zero") if zero_copy else x
        if src is None:
            raise StrataUsageError("low_latency_combine: zero_copy=True, but get_next_low_latency_combine_buffer "
                                   "was not called for this handle")
        if tuple(src.shape) != ih.recv_shape or src.dtype != inner.dtype:
            raise StrataUsageError(f"low_latency_combine: x must be {inner.dtype} {list(ih.recv_shape)} (the "
                                   f"dispatch's layout), got {src.dtype} {list(src.shape)}")
        if not torch.equal(topk_idx.long(), st["ids"].long()):
            raise StrataUsageError("low_latency_combine: topk_idx differs from the one this handle's dispatch sent")
        self._check_weights(topk_weights, st["ids"].shape)
        m = handle[2]
        window = torch.empty(ih.recv_shape, dtype=inner.dtype)
        for e in range(ih.recv_shape[0]):
            for s in range(self.group_size):
                packed = int(st["layout"][e, s])
                at, c = packed >> 32, packed & 0xFFFFFFFF
                window[e, s * m:s * m + c] = src[e, at:at + c]
        combined = inner.combine(window, ih, topk_weights)
        st["combined"] = True
        if out is not None:
            if tuple(out.shape) != tuple(combined.shape) or out.dtype != combined.dtype:
                raise StrataUsageError(f"low_latency_combine: out must be {combined.dtype} {list(combined.shape)}")
            out.copy_(combined)
            combined = out
        hook = None
        if return_recv_hook:
            self._pending_hook = "low_latency_combine"
            hook = self._hook()
        return combined, EventOverlap(), hook


def _num_experts(num_tokens_per_expert) -> int:
    """The experts of a normal-mode dispatch: num_tokens_per_expert's length (DeepEP passes the
    layout), which dispatch needs since it is not an argument."""
    if num_tokens_per_expert is None:
        raise StrataUsageError("dispatch: num_tokens_per_expert (get_dispatch_layout's) is required: it gives "
                               "the number of experts")
    return int(num_tokens_per_expert.numel())


def _rank_prefix(tok: _MoeBuffer) -> torch.Tensor:
    """rank_prefix_matrix [ranks, ranks] int32: [i][j] = tokens ranks 0..i sent to rank j."""
    counts = tok._counts.long()                 # [source rank, destination rank]: this call's table
    return counts.cumsum(dim=0).int().clone()


def _own_copy(recv_x):
    """The received rows as tensors of the caller's (a tensor, or int8 rows and scales): the
    windows are overwritten by the next dispatch and unmapped when the buffer grows."""
    return tuple(t.clone() for t in recv_x) if isinstance(recv_x, tuple) else recv_x.clone()


def _pad_rows(x, pad: int):
    """x (or each tensor of a tuple) with `pad` zero rows appended (num_worst_tokens)."""
    if isinstance(x, tuple):
        return tuple(_pad_rows(t, pad) for t in x)
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])])


def _all_gather_ids(ids: torch.Tensor, group, world: int, m: int) -> list[torch.Tensor]:
    """Every rank's top-k ids (padded to m tokens with -1), for src_info."""
    import torch.distributed as dist
    mine = torch.full((m, ids.shape[1]), -1, dtype=torch.int64)
    mine[:ids.shape[0]] = ids.long()
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return out


__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t"]
