"""The values of the verifier's simulated memory, held as pieces: its cost follows the moves, not
the elements.

A buffer is a row of pieces. A piece is either affine (element j of the piece, counted from its
start, holds a + c * j mod 2^64) or dense (an explicit uint64 array: data the instance chose, such
as expert ids and counts, and what routing constructs compute from them). Every element's initial
tag is affine in its index, with a and c drawn per rank and buffer and c odd (`Buffer.tags`).
Copies shift pieces, reductions add them and a MoE combine scales a row by a weight: each keeps an
affine piece affine. So a buffer holds as many pieces as the moves that cut it, whatever its size,
and a proof at 256 MiB costs what it costs at 1 KiB.

Why affine tags prove as much as random ones: a value the schedule leaves is a sum of initial
elements, sum_k (a_k + c_k j_k) for some (rank, buffer, index) terms (a combine's terms also
scaled by a weight element). As a polynomial in the independent a's and c's it equals the
contract's value only if every (rank, buffer) occurs as often, with the same sum of indices. Every
contract takes each element of each rank's buffer at most once into an expected value, so equal
counts mean one term at the contract's own index: equal as polynomials exactly when the schedule
is right at that element. A wrong value agrees only where a nonzero form of the random draws
vanishes mod 2^64, as with distinct random tags (c is odd, so c (j - i) never does). A value is
named back exactly (`Buffer.find`): c is invertible mod 2^64.

One buffer is tagged otherwise: the input x of an out-of-place AllGather, of n elements per rank,
is one function over the ranks, element j of rank p holding a + c (p n + j) (provenance._Initial),
so that the gathered output, block p being rank p's x, is one piece on every rank and not world of
them. The argument above needs the draws to differ per rank only where a value is a sum. Every
expected value of that contract is one element, a + c k (k = p n + j, distinct for distinct (p, j)
since j < n and k < 2^63, and c odd). A value of m elements of x with indices summing to S equals
it only if m = 1 and S = k, the right element, or if (m - 1) a = c (k - S) mod 2^64, a nonzero form
of the draws vanishing, as before; terms of other buffers bring their own draws.

`Segs` is the value of a range (what reading a slice gives); `Buffer` the value of a whole buffer,
indexed like a numpy array. Both turn into numpy arrays (`np.asarray`) where a caller needs the
elements (small buffers: expert ids, counts, offsets).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

MASK = (1 << 64) - 1
# a piece: (length, a, c) is affine; (length, array, None) is dense


def _clip(p: tuple, off: int, length: int) -> tuple:
    n, a, c = p
    if c is None:
        return (length, a[off:off + length], None)
    return (length, (a + c * off) & MASK, c)


def _dense(p: tuple) -> np.ndarray:
    n, a, c = p
    if c is None:
        return a
    with np.errstate(over="ignore"):
        return np.uint64(a) + np.uint64(c) * np.arange(n, dtype=np.uint64)


def _continues(p: tuple, q: tuple) -> bool:
    """Whether affine piece q carries on affine piece p's function."""
    return p[2] is not None and p[2] == q[2] and (p[1] + p[2] * p[0]) & MASK == q[1]


def _merge(parts: list) -> list:
    """Adjacent affine pieces that continue one another as one; empty pieces dropped."""
    out: list = []
    for p in parts:
        if p[0] == 0:
            continue
        if out and _continues(out[-1], p):
            q = out[-1]
            out[-1] = (q[0] + p[0], q[1], q[2])
        else:
            out.append(p)
    return out


def _align(x: list, y: list):
    """Both rows of pieces (of one length) cut at the union of their ends: pairs of pieces."""
    i = j = oi = oj = 0
    while i < len(x) and j < len(y):
        n = min(x[i][0] - oi, y[j][0] - oj)
        yield _clip(x[i], oi, n), _clip(y[j], oj, n)
        oi += n
        oj += n
        if oi == x[i][0]:
            i, oi = i + 1, 0
        if oj == y[j][0]:
            j, oj = j + 1, 0


def _pieces(v) -> list:
    if isinstance(v, Segs):
        return v.parts
    if isinstance(v, Buffer):
        return v.pieces(0, v.n)
    arr = np.ascontiguousarray(v, dtype=np.uint64).reshape(-1)
    return [(arr.size, arr, None)] if arr.size else []


class Segs:
    """The values of a range of elements (immutable): a row of pieces."""

    __slots__ = ("n", "parts")
    __array_ufunc__ = None      # numpy defers to our operators (a weight times a row)

    def __init__(self, n: int, parts: list):
        self.n, self.parts = n, parts

    @classmethod
    def of(cls, v) -> "Segs":
        if isinstance(v, Segs):
            return v
        parts = _pieces(v)
        return cls(sum(p[0] for p in parts), parts)

    @classmethod
    def zeros(cls, n: int) -> "Segs":
        return cls(n, [(n, 0, 0)] if n else [])

    @classmethod
    def concat(cls, items) -> "Segs":
        parts: list = []
        for v in items:
            parts.extend(_pieces(v))
        parts = _merge(parts)
        return cls(sum(p[0] for p in parts), parts)

    def __len__(self) -> int:
        return self.n

    @property
    def size(self) -> int:
        return self.n

    def copy(self) -> "Segs":
        return self

    def __add__(self, other) -> "Segs":
        other = Segs.of(other)
        if other.n != self.n:
            raise ValueError(f"adding ranges of {self.n} and {other.n} elements")
        if len(self.parts) == 1 and len(other.parts) == 1 and self.parts[0][2] is not None \
                and other.parts[0][2] is not None:    # the common case: one affine piece each
            (n, a, c), (_, b, d) = self.parts[0], other.parts[0]
            return Segs(n, [(n, (a + b) & MASK, (c + d) & MASK)])
        out = []
        for p, q in _align(self.parts, other.parts):
            if p[2] is not None and q[2] is not None:
                out.append((p[0], (p[1] + q[1]) & MASK, (p[2] + q[2]) & MASK))
            else:
                with np.errstate(over="ignore"):
                    out.append((p[0], _dense(p) + _dense(q), None))
        return Segs(self.n, _merge(out))

    __radd__ = __add__

    def __mul__(self, w) -> "Segs":
        w = int(w) & MASK
        out = []
        for n, a, c in self.parts:
            if c is None:
                with np.errstate(over="ignore"):
                    out.append((n, a * np.uint64(w), None))
            else:
                out.append((n, (a * w) & MASK, (c * w) & MASK))
        return Segs(self.n, _merge(out))

    __rmul__ = __mul__

    def dense(self) -> np.ndarray:
        if not self.parts:
            return np.zeros(0, dtype=np.uint64)
        return np.concatenate([_dense(p) for p in self.parts])

    def __array__(self, dtype=None, copy=None):
        d = self.dense()
        return d if dtype is None else d.astype(dtype)

    def astype(self, dtype) -> np.ndarray:
        return self.dense().astype(dtype)


class Buffer:
    """One buffer of one rank: pieces starting at `starts` (sorted, the first at 0), indexed like
    a one-dimensional numpy array (a slice reads a Segs; assigning a Segs or an array to a slice
    replaces those elements)."""

    __slots__ = ("n", "starts", "parts")
    __array_ufunc__ = None

    def __init__(self, n: int, starts: list[int], parts: list):
        self.n, self.starts, self.parts = n, starts, parts

    @classmethod
    def tags(cls, n: int, a: int, c: int) -> "Buffer":
        """Element i holds a + c * i: a buffer's initial tags."""
        return cls(n, [0], [(n, a, c)]) if n else cls(0, [], [])

    @classmethod
    def data(cls, arr) -> "Buffer":
        arr = np.ascontiguousarray(arr, dtype=np.uint64).reshape(-1)
        return cls(arr.size, [0], [(arr.size, arr, None)]) if arr.size else cls(0, [], [])

    def copy(self) -> "Buffer":
        return Buffer(self.n, list(self.starts), list(self.parts))

    def __len__(self) -> int:
        return self.n

    @property
    def size(self) -> int:
        return self.n

    def pieces(self, lo: int, hi: int) -> list:
        """The pieces of elements lo..hi, clipped to them."""
        if hi <= lo:
            return []
        starts, parts = self.starts, self.parts
        i = bisect_right(starts, lo) - 1
        s, p = starts[i], parts[i]
        if hi <= s + p[0]:     # within one piece: the common case
            return [p] if lo == s and hi == s + p[0] else [_clip(p, lo - s, hi - lo)]
        out = []
        while i < len(parts) and starts[i] < hi:
            s, p = starts[i], parts[i]
            a, b = max(lo, s), min(hi, s + p[0])
            out.append(p if (a, b) == (s, s + p[0]) else _clip(p, a - s, b - a))
            i += 1
        return out

    def _range(self, key: slice) -> tuple[int, int]:
        lo, hi = key.start, key.stop
        if key.step not in (None, 1):
            raise IndexError("the simulated memory is read and written in ranges of step 1")
        if lo is None or hi is None or lo < 0 or hi < 0 or hi > self.n:
            lo, hi, _ = key.indices(self.n)
        return lo, max(lo, hi)

    def read(self, lo: int, hi: int) -> Segs:
        """Elements lo..hi (0 <= lo <= hi <= n, not checked: the verifier's moves are in bounds)."""
        return Segs(hi - lo, self.pieces(lo, hi))

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi = self._range(key)
            return Segs(hi - lo, self.pieces(lo, hi))
        i = int(key)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"element {key} of a buffer of {self.n}")
        n, a, c = self.pieces(i, i + 1)[0]
        return np.uint64(a[0] if c is None else a)

    def __setitem__(self, key: slice, value) -> None:
        lo, hi = self._range(key)
        if isinstance(value, Segs):
            new, count = value.parts, value.n
        else:
            new = _pieces(value)
            count = sum(p[0] for p in new)
        if count != hi - lo:
            raise ValueError(f"assigning {count} elements to {hi - lo}")
        self.write(lo, hi, new)

    def write(self, lo: int, hi: int, new: list) -> None:
        """Elements lo..hi become the pieces `new`, of hi - lo elements (not checked, as for read)."""
        if hi <= lo:
            return
        i = bisect_right(self.starts, lo) - 1
        if len(new) == 1 and lo == self.starts[i] and hi == lo + self.parts[i][0]:
            # one piece for one piece (a ring's chunk): done unless it continues a neighbour
            p = new[0]
            if not ((i > 0 and _continues(self.parts[i - 1], p)) or
                    (i + 1 < len(self.parts) and _continues(p, self.parts[i + 1]))):
                self.parts[i] = p
                return
        j = bisect_right(self.starts, hi - 1) - 1
        left = self.parts[i]
        right = self.parts[j]
        s_i, s_j = self.starts[i], self.starts[j]
        pieces = []
        if lo > s_i:
            pieces.append(_clip(left, 0, lo - s_i))
        pieces.extend(new)
        end_j = s_j + right[0]
        if hi < end_j:
            pieces.append(_clip(right, hi - s_j, end_j - hi))
        # merge with the neighbours outside the replaced range too, so that a buffer a schedule
        # fills with one affine function (an AllReduce's result) is one piece again
        first = i - 1 if i > 0 else i
        if first < i:
            pieces.insert(0, self.parts[first])
        last = j + 1 if j + 1 < len(self.parts) else j
        if last > j:
            pieces.append(self.parts[last])
        start = self.starts[first]
        pieces = _merge(pieces)
        starts = []
        at = start
        for p in pieces:
            starts.append(at)
            at += p[0]
        self.starts[first:last + 1] = starts
        self.parts[first:last + 1] = pieces

    def dense(self) -> np.ndarray:
        return Segs(self.n, self.parts).dense()

    def __array__(self, dtype=None, copy=None):
        d = self.dense()
        return d if dtype is None else d.astype(dtype)

    def astype(self, dtype) -> np.ndarray:
        return self.dense().astype(dtype)

    def find(self, value: int) -> int | None:
        """The first element holding `value`, or None."""
        value &= MASK
        for s, (n, a, c) in zip(self.starts, self.parts):
            if c is None:
                hit = np.nonzero(a == np.uint64(value))[0]
                if hit.size:
                    return s + int(hit[0])
                continue
            j = _first_root((a - value) & MASK, c, n)
            if j is not None:
                return s + j
        return None


def _first_root(d: int, e: int, n: int) -> int | None:
    """The least j in 0..n-1 with d + e * j = 0 mod 2^64, or None."""
    if e == 0:
        return 0 if d == 0 and n else None
    t = (e & -e).bit_length() - 1            # 2^t divides e exactly
    if d & ((1 << t) - 1):
        return None
    mod = 1 << (64 - t)
    j = (((-d) & MASK) >> t) * pow(e >> t, -1, mod) % mod
    return j if j < n else None


def _roots(d: int, e: int, n: int) -> int:
    """How many j in 0..n-1 have d + e * j = 0 mod 2^64."""
    j = _first_root(d, e, n)
    if j is None:
        return 0
    if e == 0:
        return n
    period = 1 << (64 - ((e & -e).bit_length() - 1))
    return 1 + (n - 1 - j) // period


def mismatch(got, want, care: list[tuple[int, int]] | None = None) -> tuple[int, int] | None:
    """Where `got` and `want` (Buffers, Segs or arrays of one length) differ, within the ranges
    `care` (None: everywhere): (the first such element, how many), or None."""
    g, w = Segs.of(got), Segs.of(want)
    if g.n != w.n:
        raise ValueError(f"comparing {g.n} elements with {w.n}")
    ranges: list[tuple[int, int]] = []
    for lo, hi in ([(0, g.n)] if care is None else sorted(care)):
        if ranges and lo <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
        elif hi > lo:
            ranges.append((lo, hi))
    first, count, at = None, 0, 0
    pairs = list(_align(g.parts, w.parts))
    starts = []
    for p, _ in pairs:
        starts.append(at)
        at += p[0]
    for lo, hi in ranges:
        k = max(0, bisect_right(starts, lo) - 1)
        while k < len(pairs) and starts[k] < hi:
            s = starts[k]
            a, b = max(lo, s), min(hi, s + pairs[k][0][0])
            if b > a:
                p, q = _clip(pairs[k][0], a - s, b - a), _clip(pairs[k][1], a - s, b - a)
                if p[2] is not None and q[2] is not None:
                    d, e = (p[1] - q[1]) & MASK, (p[2] - q[2]) & MASK
                    bad = (b - a) - _roots(d, e, b - a)
                    if bad:
                        j = 0 if d else 1          # e != 0 here: element 1 differs
                        first = a + j if first is None else min(first, a + j)
                else:
                    diff = np.nonzero(_dense(p) != _dense(q))[0]
                    bad = int(diff.size)
                    if bad:
                        first = a + int(diff[0]) if first is None else min(first, a + int(diff[0]))
                count += bad
            k += 1
    return None if first is None else (first, count)
