"""Sample MoE routings: the expert ids each rank's tokens pick, for runs, benches and the verifier.

ids[t, k] is the k-th expert of token t, or -1 for none. Every routing is reproducible from its
seed; each rank draws from its own stream. This is input generation only: the verifier's reference
layout and the run's torch reference are computed elsewhere, from the ids alone.
"""

from __future__ import annotations

import numpy as np

ROUTINGS = ("uniform", "skewed", "single", "empty", "sparse")
DESCRIPTIONS = {
    "uniform": "each token picks topk distinct experts uniformly at random",
    "skewed": "9 of 10 tokens pick expert 0 first; the other picks are uniform",
    "single": "every token picks expert 0 and nothing else (the other slots are -1)",
    "empty": "tokens pick only among the first half of the experts; the rest receive nothing",
    "sparse": "uniform, then a quarter of the slots are -1, and token 0 has no expert at all",
}


# A routing of the verifier's only (not one to run or bench with): it is built from the call's
# capacity, so that a slotted layout is checked with every slot of some (expert, source) pair in use.
FULL = "full"
FULL_DESCRIPTION = ("the entries fill the capacity's slots of one expert after another: every "
                    "(expert, source) pair but the last holds exactly `capacity` tokens")


def expert_ids(routing: str, rank: int, tokens: int, topk: int, experts: int,
               seed: int = 0, capacity: int | None = None) -> np.ndarray:
    """int32 [tokens, topk] expert ids of one rank's tokens. `capacity`: the slots per (expert,
    source rank) the FULL routing fills (None: tokens); the other routings ignore it."""
    if routing not in ROUTINGS and routing != FULL:
        raise ValueError(f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}")
    if topk > experts:
        raise ValueError(f"topk ({topk}) cannot exceed the number of experts ({experts})")
    if routing == FULL:
        return full_ids(rank, tokens, topk, experts, tokens if capacity is None else capacity)
    rng = np.random.default_rng([seed, rank, ROUTINGS.index(routing)])
    ids = np.full((tokens, topk), -1, dtype=np.int32)
    if routing == "single":
        if topk:
            ids[:, 0] = 0
        return ids
    pool = experts if routing != "empty" else max(1, experts // 2)
    k = min(topk, pool)
    # k distinct experts per token: the k smallest of `pool` uniform keys, i.e. a random k-subset
    # in random order (vectorised: large sweeps draw millions of ids)
    keys = rng.random((tokens, pool))
    ids[:, :k] = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < pool else np.argsort(keys, axis=1)
    if routing == "skewed" and topk:
        hot = (rng.random(tokens) < 0.9) & ~(ids == 0).any(axis=1)
        ids[hot, 0] = 0
    if routing == "sparse":
        ids[rng.random(ids.shape) < 0.25] = -1
        if tokens:
            ids[0] = -1
    return ids


def full_ids(rank: int, tokens: int, topk: int, experts: int, capacity: int) -> np.ndarray:
    """The FULL routing: entry (t, k) is the (k * tokens + t)-th, and the i-th entry goes to block
    i // c (c = capacity, at most tokens, at least 1) of experts counted from expert `rank`: every
    expert but the last used receives exactly c of this rank's entries. A token's entries lie at
    least tokens >= c apart, so it never picks an expert twice. Entries past what the experts'
    capacity holds (topk * tokens > c * experts) are -1 (none)."""
    c = max(1, min(capacity, tokens))
    i = np.arange(topk)[None, :] * tokens + np.arange(tokens)[:, None]
    block = i // c
    return np.where(block < experts, (block + rank) % max(1, experts), -1).astype(np.int32)
