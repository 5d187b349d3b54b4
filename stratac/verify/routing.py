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


def expert_ids(routing: str, rank: int, tokens: int, topk: int, experts: int,
               seed: int = 0) -> np.ndarray:
    """int32 [tokens, topk] expert ids of one rank's tokens."""
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}")
    if topk > experts:
        raise ValueError(f"topk ({topk}) cannot exceed the number of experts ({experts})")
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
