"""The verifier's memory in pieces (stratac.verify.segments) against numpy arrays of every element.

Random reads, writes, sums, scalings and comparisons on both, checked to agree element for
element; plus what pieces buy: a buffer of 2^40 elements costs what one of ten does.
"""

from __future__ import annotations

import numpy as np
import pytest

from stratac.verify.segments import MASK, Buffer, Segs, mismatch


def affine(n: int, a: int, c: int) -> np.ndarray:
    return np.array([(a + c * j) & MASK for j in range(n)], dtype=np.uint64)


@pytest.mark.parametrize("seed", range(20))
def test_random_moves_agree_with_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    bufs, ref = [], []
    for k in range(3):
        a, c = (int(v) for v in rng.integers(0, 2**63, size=2, dtype=np.int64))
        a, c = (a * 3 + k) & MASK, (c * 2 + 1) & MASK
        if k == 2:      # a dense one: data
            arr = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
            bufs.append(Buffer.data(arr))
            ref.append(arr.copy())
        else:
            bufs.append(Buffer.tags(n, a, c))
            ref.append(affine(n, a, c))
    with np.errstate(over="ignore"):
        for _ in range(60):
            d, s1, s2 = (int(v) for v in rng.integers(0, 3, size=3))
            m = int(rng.integers(0, n + 1))
            lo, l1, l2 = (int(v) for v in rng.integers(0, n - m + 1, size=3))
            kind = rng.integers(0, 4)
            if kind == 0:
                bufs[d][lo:lo + m] = bufs[s1][l1:l1 + m]
                ref[d][lo:lo + m] = ref[s1][l1:l1 + m].copy()
            elif kind == 1:
                bufs[d][lo:lo + m] = bufs[s1][l1:l1 + m] + bufs[s2][l2:l2 + m]
                ref[d][lo:lo + m] = ref[s1][l1:l1 + m] + ref[s2][l2:l2 + m]
            elif kind == 2:
                w = int(rng.integers(1, 2**62))
                bufs[d][lo:lo + m] = w * bufs[s1][l1:l1 + m]
                ref[d][lo:lo + m] = np.uint64(w) * ref[s1][l1:l1 + m]
            else:
                bufs[d][lo:lo + m] = bufs[d][lo:lo + m] + Segs.zeros(m)
            for b, r in zip(bufs, ref):
                assert np.array_equal(np.asarray(b), r)
                assert b.starts[0] == 0 and b.starts == sorted(set(b.starts))
                i = int(rng.integers(0, n))
                assert int(b[i]) == int(r[i])


@pytest.mark.parametrize("seed", range(10))
def test_mismatch_and_find_agree_with_numpy(seed):
    rng = np.random.default_rng(100 + seed)
    n = 30
    got = Buffer.tags(n, 5, 7)
    want = Buffer.tags(n, 5, 7)
    got[3:9] = Buffer.tags(6, 11, 7)[0:6]
    got[20:25] = Buffer.tags(5, (5 + 7 * 21) & MASK, 7)[0:5]       # equal but for one element
    got[27:28] = np.array([12345], dtype=np.uint64)
    g, w = np.asarray(got), np.asarray(want)
    care = None if seed % 2 else [(0, 10), (18, 29), (5, 12)]
    mask = np.ones(n, dtype=bool)
    if care:
        mask[:] = False
        for lo, hi in care:
            mask[lo:hi] = True
    bad = np.nonzero((g != w) & mask)[0]
    assert mismatch(got, want, care) == (int(bad[0]), int(bad.size))
    v = int(w[int(rng.integers(0, n))])
    hits = np.nonzero(w == np.uint64(v))[0]
    assert want.find(v) == int(hits[0])
    assert want.find(v ^ (1 << 63)) is None


def test_a_root_of_an_even_slope_is_found_and_counted():
    # d + e j = 0 mod 2^64 with e = 2^62: j = 2 and every j = 2 + 4k
    d, e = (-(2 << 62)) & MASK, 1 << 62
    b = Buffer.tags(12, d, e)
    assert b.find(0) == 2
    assert mismatch(b, Segs.zeros(12)) == (0, 12 - 3)      # zeros at j = 2, 6, 10


def test_a_huge_buffer_costs_its_pieces_not_its_elements():
    n = 1 << 40
    x = Buffer.tags(n, 1, 3)
    y = Buffer.tags(n, 2, 5)
    x[n // 2:n] = x[n // 2:n] + y[n // 2:n]
    assert len(x.parts) == 2
    x[0:n // 2] = x[0:n // 2] + y[0:n // 2]
    assert len(x.parts) == 1                     # one affine function again: the pieces merged
    assert mismatch(x, Segs.of(Buffer.tags(n, 3, 8))) is None
    assert x.find((3 + 8 * (n - 1)) & MASK) == n - 1
