"""A sample routing of MoE and AllToAllV schedules. In: every rank's expert ids
(stratac.verify.routing.expert_ids, or given). Out: a Routed, what the costs need of them: per rank
the routed entries and where they go (expert e lives on rank e // (experts / world)), and how the
kernels split them over the cores.
"""

from __future__ import annotations

import numpy as np


class Routed:
    """The expert ids of every rank at one size, from stratac.verify.routing.expert_ids, reduced to
    what the costs need: per rank the routed entries and where they go (a world x world table of
    entries per source and owner), and their positions, for the kernel's split over the cores.
    Arrays are per (token, k) entry, never per element of a row."""

    def __init__(self, ids: list[np.ndarray], experts: int, routing: str = "custom"):
        self.world = len(ids)
        shape = ids[0].shape if ids else (0, 1)
        self.tokens, self.topk = (tuple(shape) + (1,))[:2]
        self.experts, self.routing = experts, routing
        W, L = self.world, max(1, experts // max(1, self.world))
        self.valid = np.zeros((W, self.tokens * self.topk), dtype=bool)
        self.owners = np.zeros((W, W), dtype=np.int64)      # [source, owner]: routed entries
        self.per_expert = np.zeros(max(experts, 0), dtype=np.int64)   # rows each expert receives
        for r, x in enumerate(ids):
            x = np.asarray(x).reshape(-1)
            v = (x >= 0) & (x < experts)
            self.valid[r] = v
            self.owners[r] = np.bincount(x[v] // L, minlength=W)[:W]
            self.per_expert += np.bincount(x[v], minlength=experts)[:experts]
        self.routed = self.owners.sum(axis=1)               # entries each rank routes
        self._split: dict = {}

    @classmethod
    def sample(cls, routing: str, world: int, tokens: int, topk: int, experts: int,
               seed: int = 0) -> "Routed":
        from stratac.verify.routing import expert_ids
        return cls([expert_ids(routing, r, tokens, topk, experts, seed) for r in range(world)],
                   experts, routing)

    @property
    def received(self) -> np.ndarray:
        """Rows each rank receives in dispatch (and reads back in combine: the same rows)."""
        return self.owners.sum(axis=0)

    def place_split(self, cores: int) -> tuple[np.ndarray, np.ndarray]:
        """Router::Place on `cores` cores: (rows [world, cores], ids scanned [world, cores]). Core c
        moves the routed entries [routed * c / cores, routed * (c + 1) / cores) in (t, k) order,
        after counting the routed entries (every id once) and scanning up to its last entry."""
        key = ("place", cores)
        if key not in self._split:
            W, n = self.world, self.valid.shape[1]
            bounds = self.routed[:, None] * np.arange(cores + 1)[None, :] // cores
            rows = np.diff(bounds, axis=1)
            scanned = np.zeros((W, cores), dtype=np.int64)
            for r in range(W):
                pos = np.flatnonzero(self.valid[r])
                hi = bounds[r, 1:]
                if len(pos):
                    scanned[r] = np.where(hi > 0, pos[np.maximum(hi, 1) - 1] + 1, 0)
            self._split[key] = (rows, scanned + n)
        return self._split[key]

    def gather_split(self, cores: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Router::Gather on `cores` cores: (entries [world, cores], tokens [cores], last token
        [cores]). Core c combines tokens [tokens * c / cores, tokens * (c + 1) / cores), after
        counting the earlier tokens' entries per expert (their ids scanned)."""
        key = ("gather", cores)
        if key not in self._split:
            W, T = self.world, self.tokens
            per_token = self.valid.reshape(W, T, self.topk).sum(axis=2)
            cum = np.concatenate((np.zeros((W, 1), dtype=np.int64), np.cumsum(per_token, axis=1)), axis=1)
            b = T * np.arange(cores + 1) // cores
            self._split[key] = (cum[:, b[1:]] - cum[:, b[:-1]], np.diff(b), b[1:])
        return self._split[key]
