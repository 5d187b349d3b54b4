"""Tests of the CPU model of Ascend C + SHMEM for Ascend (runtime/cpu).

The C++ programs in cpp/ run kernels on the model (several ranks are forked processes sharing the
pool); every result is compared with expectations computed here independently: data movement from
closed-form formulas, numerics from numpy and from exact rational arithmetic over tables of every
16-bit value, failures from the rule table of runtime/README.md.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

# ---------------------------------------------------------------------------------------------
# helpers

def run_driver(driver: Path, out: Path, *args, timeout: float = 60.0, env: dict | None = None
               ) -> dict[int, list[str]]:
    """Runs the driver; returns {rank: [line, ...]} of its `rank R: ...` lines."""
    proc = subprocess.run([str(driver), args[0], str(out), *map(str, args[1:])], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"driver {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines: dict[int, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"rank (\d+): (.*)", line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def field(lines: list[str], key: str) -> str:
    found = [l[len(key) + 1:] for l in lines if l.startswith(key + " ")]
    assert found, f"no '{key}' line in {lines}"
    return found[0]


def ceil512(n: int) -> int:
    return (n + 511) // 512 * 512


# ---------------------------------------------------------------------------------------------
# data movement across ranks: MTE through aclshmem_ptr, SDMA put/get, signals, counters

@pytest.mark.parametrize("world,cores,n,sdma_delay_us,seed", [(1, 2, 256, 0, None), (3, 4, 1001, 0, None),
                                                               (3, 2, 64, 20000, None), (3, 4, 1001, 5000, 7)])
def test_exchange(driver, tmp_path, world, cores, n, sdma_delay_us, seed):
    # With a slow SDMA engine (every copy 20 ms, or each its own latency in [0, 5] ms), data checked
    # right after each quiet (in the kernel) and flags raised after it show whether quiet really
    # waits for the copies.
    env = {"STRATA_CPU_SDMA_DELAY_US": str(sdma_delay_us)}
    if seed is not None:
        env["STRATA_CPU_SDMA_DELAY_SEED"] = str(seed)
    out = run_driver(driver, tmp_path, "exchange", world, cores, n, env=env)
    assert sorted(out) == list(range(world))
    chunk = 4 * n
    sizes = [cores * chunk, world * cores * chunk, world * cores * chunk, cores * chunk, cores * 64]
    offsets = np.cumsum([0] + [ceil512(s) for s in sizes])
    for r in range(world):
        allocs = [l for l in out[r] if l.startswith("alloc ")]
        # deterministic symmetric allocator: the same offsets on every rank, packed at 512 bytes
        assert allocs == [f"alloc {s} at {o}" for s, o in zip(sizes, offsets)]
        assert int(field(out[r], "heap_used")) == offsets[-1]

        i = np.arange(n, dtype=np.float64)
        expect_all = np.stack([np.stack([s * 1e6 + c * 1e4 + i for c in range(cores)]) for s in range(world)])
        mte = np.fromfile(tmp_path / f"exchange_mte_{r}.bin", dtype=np.float32).reshape(world, cores, n)
        sdma = np.fromfile(tmp_path / f"exchange_sdma_{r}.bin", dtype=np.float32).reshape(world, cores, n)
        get = np.fromfile(tmp_path / f"exchange_get_{r}.bin", dtype=np.float32).reshape(cores, n)
        flags = np.fromfile(tmp_path / f"exchange_flags_{r}.bin", dtype=np.int32).reshape(cores, 16)
        np.testing.assert_array_equal(mte, expect_all)
        np.testing.assert_array_equal(sdma, expect_all)
        np.testing.assert_array_equal(get, expect_all[(r + 1) % world])
        np.testing.assert_array_equal(flags[:, 0], np.full(cores, world))
        np.testing.assert_array_equal(flags[:, 1:], 0)

        # counters per core: MTE in, MTE out, SDMA, remote read, remote write, SDMA posts, SQEs
        assert int(field(out[r], "cores")) == cores
        for c in range(cores):
            got = [int(v) for v in field(out[r], f"counters {c}").split()]
            remote_read = chunk if world > 1 else 0  # the SDMA get reads rank r+1
            remote_write = 2 * (world - 1) * chunk    # MTE and SDMA puts to the other ranks
            posts = world + 1                         # a put to every rank and one get
            sqes = posts * -(-chunk // 2**20)         # each post in 1 MiB SQEs (chunk <= 4 KiB: 1)
            assert got == [chunk, world * chunk, (world + 1) * chunk, remote_read, remote_write, posts, sqes]


def test_atomic_from_several_ranks(driver, tmp_path):
    world, cores, m, rounds = 3, 4, 2048, 3
    run_driver(driver, tmp_path, "atomic", world, cores, m, rounds)
    i = np.arange(m, dtype=np.int64)
    ks = np.arange(1, world * cores + 1, dtype=np.int64)
    expect_f = rounds * ks.sum() * (i % 7 + 1)
    got_f = np.fromfile(tmp_path / "atomic_f.bin", dtype=np.float32)
    np.testing.assert_array_equal(got_f, expect_f.astype(np.float32))

    total = rounds * (ks.sum() * 1000003 * (i + 1))  # int32 adds wrap
    expect_i = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "atomic_i.bin", dtype=np.int32), expect_i)

    cand = np.array([[(k * 37 + i + r * 11) % 101 for r in range(rounds)] for k in ks])  # [k, r, i]
    expect_max = cand.max(axis=(0, 1)).astype(np.float32)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "atomic_max.bin", dtype=np.float32), expect_max)


def test_syncall_eight_cores(driver, tmp_path):
    cores, rounds = 8, 150
    run_driver(driver, tmp_path, "syncall", cores, rounds)
    stride = (rounds + 15) // 16 * 16   # core c's sums are row c, padded to whole 64-byte lines
    sums = np.fromfile(tmp_path / "syncall_sums.bin", dtype=np.int32).reshape(cores, stride)[:, :rounds].T
    r = np.arange(rounds)
    expect = cores * cores * r + cores * (cores - 1) // 2
    np.testing.assert_array_equal(sums, np.repeat(expect[:, None], cores, axis=1))


# ---------------------------------------------------------------------------------------------
# numerics: casts in every round mode, 16-bit arithmetic rounding, int32 wrap

MODES = ["NONE", "RINT", "FLOOR", "CEIL", "ROUND", "TRUNC", "ODD"]


def _table16(kind: str):
    """Every non-NaN value of a 16-bit float format: sorted values, value -> bits, threshold from
    which round-to-nearest overflows to infinity."""
    bits = np.arange(65536, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        if kind == "f16":
            vals = bits.astype(np.uint16).view(np.float16).astype(np.float64)
        else:
            vals = (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    bits_of = {}
    for b, v in zip(bits.tolist(), vals.tolist()):
        if not math.isnan(v) and (v not in bits_of or b < bits_of[v]):
            bits_of[v] = b
    values = np.array(sorted(bits_of))
    finite = values[np.isfinite(values)]
    top, below = finite[-1], finite[-2]
    return values, bits_of, top + (top - below) / 2


TABLES = {}


def ref_round16(x: float, kind: str, mode: str):
    """Reference rounding of an exactly known x to a 16-bit format; None for NaN."""
    if kind not in TABLES:
        TABLES[kind] = _table16(kind)
    values, bits_of, overflow_at = TABLES[kind]
    if math.isnan(x):
        return None
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    if x in bits_of:
        r = x
    else:
        k = int(np.searchsorted(values, x))
        lo, hi = values[k - 1], values[k]
        if mode == "FLOOR":
            r = lo
        elif mode == "CEIL":
            r = hi
        elif mode == "TRUNC":
            r = lo if x > 0 else hi
        elif mode == "ODD":
            r = lo if bits_of[lo] & 1 else hi
        elif abs(x) >= overflow_at:
            r = math.copysign(math.inf, x)
        else:
            dl = Fraction(x) - Fraction(lo)
            dh = Fraction(hi) - Fraction(x) if math.isfinite(hi) else math.inf
            if dl != dh:
                r = lo if dl < dh else hi
            elif mode == "ROUND":
                r = hi if x > 0 else lo
            else:  # NONE, RINT: ties to even
                r = lo if bits_of[lo] % 2 == 0 else hi
    return sign if r == 0 else bits_of[r]


def ref_round_f32(x: int, mode: str) -> float:
    """Reference rounding of an int32 to float32."""
    a = np.float32(x)
    if int(a) == x:
        return float(a)
    lo, hi = (a, np.nextafter(a, np.float32(np.inf))) if int(a) < x else (np.nextafter(a, np.float32(-np.inf)), a)
    lo, hi = float(lo), float(hi)
    if mode == "FLOOR":
        return lo
    if mode == "CEIL":
        return hi
    if mode == "TRUNC":
        return lo if x > 0 else hi
    odd = lambda v: int(np.float32(v).view(np.uint32)) & 1
    if mode == "ODD":
        return lo if odd(lo) else hi
    dl, dh = Fraction(x) - Fraction(lo), Fraction(hi) - Fraction(x)
    if dl != dh:
        return lo if dl < dh else hi
    if mode == "ROUND":
        return hi if x > 0 else lo
    return lo if not odd(lo) else hi


def ref_to_int32(x: float, mode: str) -> int:
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return 2**31 - 1 if x > 0 else -(2**31)
    f = Fraction(x)
    if mode == "FLOOR":
        r = math.floor(f)
    elif mode == "CEIL":
        r = math.ceil(f)
    elif mode == "TRUNC":
        r = math.trunc(f)
    elif mode == "ROUND":
        r = int(math.copysign(math.floor(abs(f) + Fraction(1, 2)), x))
    else:  # NONE, RINT, ODD: nearest, ties to even
        r = round(f)
    return max(-(2**31), min(2**31 - 1, r))


def f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# Hand-computed float32 -> bfloat16 cases: (float32 bits, mode, bfloat16 bits)
BF16_CASES = [
    (0x3F800000, "RINT", 0x3F80),   # 1.0 exact
    (0x3F808000, "RINT", 0x3F80),   # halfway, lower neighbour even
    (0x3F818000, "RINT", 0x3F82),   # halfway, upper neighbour even
    (0x3F808001, "RINT", 0x3F81),   # just above halfway
    (0x3F808000, "ROUND", 0x3F81),  # halfway, away from zero
    (0xBF808000, "ROUND", 0xBF81),
    (0x40490FDB, "RINT", 0x4049),   # pi
    (0x40490FDB, "CEIL", 0x404A),
    (0xC0490FDB, "FLOOR", 0xC04A),  # -pi
    (0xC0490FDB, "TRUNC", 0xC049),
    (0x7F7FFFFF, "RINT", 0x7F80),   # FLT_MAX rounds to +inf
    (0x7F7FFFFF, "FLOOR", 0x7F7F),  # ... or down to the largest bfloat16
    (0x00000001, "RINT", 0x0000),   # smallest float subnormal
    (0x00000001, "CEIL", 0x0001),
    (0x80000001, "CEIL", 0x8000),
    (0xBFC00000, "TRUNC", 0xBFC0),  # -1.5 exact
]
# The RoundModes A2/A3 take per Cast pair (asc-devkit docs Cast.md; ascendc_cast.h CastModes):
# the numeric kernel runs only these, and leaves the other rows zero.
DIRECTED = ["RINT", "FLOOR", "CEIL", "ROUND", "TRUNC"]
F32_TO_BF16 = F32_TO_I32 = DIRECTED
I32_TO_F32 = ["NONE"] + DIRECTED
F16_CASES = [  # (value, mode, float16 bits) hand-computed
    (2049.0, "RINT", 0x6800), (2051.0, "RINT", 0x6802), (2049.0, "ROUND", 0x6801),
    (65519.0, "RINT", 0x7BFF), (65520.0, "RINT", 0x7C00), (65520.0, "FLOOR", 0x7BFF),
    (-65520.0, "CEIL", 0xFBFF), (1.0 / 3.0, "RINT", 0x3555), (1.0 / 3.0, "CEIL", 0x3556),
]


@pytest.fixture(scope="module")
def numeric(driver, tmp_path_factory):
    n = 256
    rng = np.random.default_rng(20240607)
    specials = [0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000, 0x7F7FFFFF, 0xBFC00000,
                0x40490FDB, 0xC0490FDB, 0x00000001, 0x80000001, 0x7FC00000, 0xFF800000, 0x7F800000,
                0x80000000, 0x00000000, 0x3F810000, 0x3F820001]
    floats = [65504.0, 65519.0, 65520.0, 65536.0, -65520.0, 2049.0, 2051.0, 2050.0, 0.5, 1.5, 2.5, -2.5, -0.5,
              1e-8, 2.98023223876953125e-08, 8.940696716308594e-08, 1.0 / 3.0, 3e9, -3e9, 2147483520.0,
              2147483648.0, -2147483648.0, -1e-10, 7.5, -7.5, 1e5]
    xs = [f32(b) for b in specials] + floats
    h = rng.standard_normal(40).astype(np.float16)                    # float16 halfway points
    xs += list((h.astype(np.float32) + np.nextafter(h, np.float16(np.inf)).astype(np.float32)) / 2)
    b = (rng.integers(0, 0x7F00, 20) | (rng.integers(0, 2, 20) << 15)).astype(np.uint32)  # bf16 halfway
    xs += list(((b << 16) | 0x8000).view(np.float32))
    xs += list(rng.integers(0, 2**32, 20, dtype=np.uint64).astype(np.uint32).view(np.float32))
    rest = n - len(xs)
    xs += list((rng.standard_normal(rest) * 10.0 ** rng.uniform(-9, 7, rest)).astype(np.float32))
    xs = np.array(xs, dtype=np.float32)

    ha = (rng.standard_normal(n) * 100).astype(np.float16)
    hb = (rng.standard_normal(n) * 30).astype(np.float16)
    ha[:3], hb[:3] = [2048, 2048, 65504], [1, 3, 65504]
    ba = (rng.standard_normal(n).astype(np.float32) * 1000).view(np.uint32) >> 16
    bb = (rng.standard_normal(n).astype(np.float32) * 10).view(np.uint32) >> 16
    ia = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
    ib = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
    ia[:6] = [2**31 - 1, -(2**31), 16777217, 16777219, -16777217, 2**31 - 65]
    ib[:6] = [1, -1, 3, 5, 7, 11]
    ia, ib = ia.astype(np.int32), ib.astype(np.int32)

    out_dir = tmp_path_factory.mktemp("numeric")
    with open(out_dir / "numeric_in.bin", "wb") as f:
        for a in (xs, ha, hb, ba.astype(np.uint16), bb.astype(np.uint16), ia, ib):
            f.write(a.tobytes())
    run_driver(driver, out_dir, "numeric", n)
    raw = (out_dir / "numeric_out.bin").read_bytes()
    pos = 0

    def take(dtype, count):
        nonlocal pos
        a = np.frombuffer(raw, dtype=dtype, count=count, offset=pos)
        pos += a.nbytes
        return a

    res = {
        "f16": take(np.uint16, 7 * n).reshape(7, n), "bf16": take(np.uint16, 7 * n).reshape(7, n),
        "i32": take(np.int32, 7 * n).reshape(7, n), "i2f": take(np.float32, 7 * n).reshape(7, n),
        "i2h": take(np.uint16, 7 * n).reshape(7, n), "h_back": take(np.float32, n), "b_back": take(np.float32, n),
        "h_ops": take(np.uint16, 7 * n).reshape(7, n), "b_ops": take(np.uint16, 7 * n).reshape(7, n),
        "i_ops": take(np.int32, 5 * n).reshape(5, n), "dup": take(np.float32, n),
    }
    assert pos == len(raw)
    inputs = dict(xs=xs, ha=ha, hb=hb, ba=ba.astype(np.uint16), bb=bb.astype(np.uint16), ia=ia, ib=ib)
    return inputs, res


def _check16(got_bits, xs, kind, what, modes=MODES):
    bad = []
    for m, mode in enumerate(MODES):
        if mode not in modes:
            assert not got_bits[m].any(), f"{what} {mode} is not an A2/A3 mode but was computed"
            continue
        for x, g in zip(xs.tolist(), got_bits[m].tolist()):
            want = ref_round16(float(x), kind, mode)
            ok = (want is None and (g & 0x7FFF) > (0x7C00 if kind == "f16" else 0x7F80)) or g == want
            if not ok:
                bad.append(f"{what} {mode} x={x!r}: got {g:#06x} want {want if want is None else hex(want)}")
    assert not bad, "\n".join(bad[:20])


def test_cast_float_to_half_all_modes(numeric):
    inputs, res = numeric
    _check16(res["f16"], inputs["xs"], "f16", "f32->f16")
    # round to nearest even agrees with numpy's conversion too
    finite = ~np.isnan(inputs["xs"])
    with np.errstate(over="ignore"):
        want = inputs["xs"][finite].astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(res["f16"][1][finite], want)
    for value, mode, want in F16_CASES:
        k = int(np.nonzero(inputs["xs"] == np.float32(value))[0][0])
        assert res["f16"][MODES.index(mode)][k] == want, (value, mode)


def test_cast_float_to_bf16_all_modes(numeric):
    inputs, res = numeric
    _check16(res["bf16"], inputs["xs"], "bf16", "f32->bf16", F32_TO_BF16)
    xbits = inputs["xs"].view(np.uint32)
    for fbits, mode, want in BF16_CASES:
        k = int(np.nonzero(xbits == fbits)[0][0])
        assert res["bf16"][MODES.index(mode)][k] == want, (hex(fbits), mode)
    nan = int(np.nonzero(xbits == 0x7FC00000)[0][0])
    assert res["bf16"][1][nan] == 0x7FC0


def test_cast_float_to_int32_all_modes(numeric):
    inputs, res = numeric
    for m, mode in enumerate(MODES):
        if mode not in F32_TO_I32:
            assert not res["i32"][m].any(), mode
            continue
        want = [ref_to_int32(float(x), mode) for x in inputs["xs"]]
        np.testing.assert_array_equal(res["i32"][m], np.array(want, dtype=np.int64), err_msg=mode)


def test_cast_int32_to_float_all_modes(numeric):
    inputs, res = numeric
    for m, mode in enumerate(MODES):
        if mode not in I32_TO_F32:
            assert not res["i2f"][m].any(), mode
            continue
        want = [ref_round_f32(int(x), mode) for x in inputs["ia"]]
        np.testing.assert_array_equal(res["i2f"][m], np.array(want, dtype=np.float32), err_msg=mode)
    assert not res["i2h"].any()   # int32 -> half needs SetDeqScale: not modelled, not built
    assert res["i2f"][MODES.index("RINT")][2] == 16777216.0   # 2^24 + 1: tie to even
    assert res["i2f"][MODES.index("CEIL")][2] == 16777218.0


def test_half_bf16_round_trip(numeric):
    inputs, res = numeric
    xs = inputs["xs"]
    finite = ~np.isnan(xs)
    with np.errstate(over="ignore"):
        want = xs[finite].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(res["h_back"][finite], want)
    np.testing.assert_array_equal(res["b_back"].view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(res["b_back"].view(np.uint32) >> 16, res["bf16"][1])


def test_half_arithmetic_rounds_once(numeric):
    inputs, res = numeric
    a, b = inputs["ha"].astype(np.float32), inputs["hb"].astype(np.float32)
    s01, s3 = np.float32(np.float16(0.1)), np.float32(3.0)
    with np.errstate(over="ignore"):
        want = [a + b, a - b, a * b, np.maximum(a, b), np.minimum(a, b), a * s01, a + s3]
        for k, w in enumerate(want):
            np.testing.assert_array_equal(res["h_ops"][k], w.astype(np.float16).view(np.uint16), err_msg=str(k))
    assert res["h_ops"][0][0] == 0x6800   # 2048 + 1 -> 2048 (tie to even)
    assert res["h_ops"][0][1] == 0x6802   # 2048 + 3 -> 2052
    assert res["h_ops"][0][2] == 0x7C00   # 65504 + 65504 -> inf


def test_bf16_arithmetic_through_float_rounds_like_float_then_rint(numeric):
    # A2/A3 have no bfloat16_t arithmetic: the kernel casts to float, computes, casts back (RINT)
    inputs, res = numeric
    a, b = bf16_value(inputs["ba"]), bf16_value(inputs["bb"])
    s01 = bf16_value(np.array([ref_round16(0.1, "bf16", "RINT")], dtype=np.uint16))[0]
    want = [a + b, a - b, a * b, np.maximum(a, b), np.minimum(a, b), a * s01, a + np.float32(3.0)]
    for k, w in enumerate(want):
        expect = [ref_round16(float(v), "bf16", "RINT") for v in w]
        np.testing.assert_array_equal(res["b_ops"][k], np.array(expect, dtype=np.uint16), err_msg=str(k))


def test_int32_arithmetic_wraps(numeric):
    inputs, res = numeric
    a, b = inputs["ia"].astype(np.int64), inputs["ib"].astype(np.int64)
    wrap = lambda v: ((v + 2**31) % 2**32 - 2**31).astype(np.int32)
    for k, w in enumerate([a + b, a - b, a * b, np.maximum(a, b), np.minimum(a, b)]):
        np.testing.assert_array_equal(res["i_ops"][k], wrap(w), err_msg=str(k))
    assert res["i_ops"][0][0] == -(2**31)   # INT_MAX + 1
    np.testing.assert_array_equal(res["dup"], np.full(len(res["dup"]), -3.0, dtype=np.float32))


def test_bfloat16_type_is_two_trivially_copyable_bytes(numeric):
    # The static_asserts in ascendc_types.h compiled; check the storage order via the round trip:
    # bf16 of 1.0 is 0x3F80 and decodes to exactly 1.0.
    inputs, res = numeric
    k = int(np.nonzero(inputs["xs"].view(np.uint32) == 0x3F800000)[0][0])
    assert res["bf16"][1][k] == 0x3F80 and res["b_back"][k] == 1.0


# ---------------------------------------------------------------------------------------------
# rule violations (runtime/README.md) : case id, cores, timeout, expected message pieces

PREFIX = "rank 0 core 3 strata:? kernel fail_kernel: "
FAIL_CASES = {
    "ub_capacity": (0, 4, 10, ["rank 0 core 3 strata:21 kernel fail_kernel: TPipe::InitBuffer: UB overflow: "
                               "2 x 100000 bytes", "exceed the 196608-byte Unified Buffer"]),
    "datacopy_36_bytes": (1, 4, 10, ["rank 0 core 3 strata:12 kernel fail_kernel: DataCopy of 36 bytes is not a "
                                     "multiple of 32 bytes (use DataCopyPad)"]),
    "gm_past_tensor_size": (2, 4, 10, [PREFIX + "DataCopy: GM access of elements [0, 32) is past the "
                                       "GlobalTensor size 16"]),
    "gm_outside_pool": (3, 4, 10, [PREFIX + "DataCopy: GM range", "is outside the pool's heaps"]),
    "syncall_aiv_only": (4, 4, 10, ["SyncAll needs KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0)",
                                    "this kernel declared KERNEL_TYPE_AIV_ONLY"]),
    "syncall_no_type": (5, 4, 10, ["SyncAll needs", "this kernel declared no kernel type"]),
    "sdma_without_quiet": (6, 4, 10, [PREFIX + "kernel returned with 1 SDMA copies not waited for by "
                                      "aclshmemx_sdma_quiet"]),
    "sdma_scratch_size": (7, 4, 10, [PREFIX + "aclshmemx_sdma_put_nbi: ub_size 32 must be at least 64"]),
    "wait_timeout": (9, 1, 0.5, ["rank 0 core 0 strata:? kernel fail_kernel: aclshmem_signal_wait_until timed "
                                 "out after 0.5 s: flag at rank 0 heap offset 256 (0x100): ACLSHMEM_CMP_EQ "
                                 "(expected == 7), seen 3"]),
    "queue_depth": (10, 2, 10, ["TQue::AllocTensor: all 2 buffers of the queue are allocated (FreeTensor "
                                "missing"]),
    "waitflag_unset": (11, 4, 10, [PREFIX + "WaitFlag<HardEvent::V_MTE3>(1) without a matching SetFlag"]),
    "ub_bounds": (12, 4, 10, [PREFIX + "Add: dst UB access of 256 bytes at UB offset 4000 overruns its buffer "
                              "(96 bytes left"]),
    "shmem_ptr_foreign": (13, 4, 10, [PREFIX + "aclshmem_ptr: ", "is not in this rank's heap instance"]),
    "pad_block_count": (14, 4, 10, [PREFIX + "DataCopyPad with blockCount 2", "not modeled"]),
    "syncall_after_exit": (15, 4, 10, ["SyncAll can never complete: core 0 returned from the kernel without "
                                       "reaching it"]),
    "uncaught_exception": (16, 4, 10, [PREFIX + "uncaught C++ exception: boom"]),
    "tbuf_offset": (18, 4, 10, [PREFIX + "TBuf::GetWithOffset: byte offset 100 is not 32-byte aligned"]),
    "deque_empty": (19, 4, 10, [PREFIX + "TQue::DeQue on an empty queue"]),
    # the scalar data cache (runtime/README.md, "scalar data cache")
    "two_cores_one_line": (25, 2, 10, ["rank 0 core 1 strata:72 kernel fail_kernel: GlobalTensor::SetValue: two "
                                       "cores scalar-store into one 64-byte line (at rank 0 heap offset 3072 "
                                       "(0xc00)): core 0 already SetValue'd into it in this launch; the hardware "
                                       "loses one of the writes (asc-devkit DataCacheCleanAndInvalid.md example 3)"]),
    "dirty_line_at_return": (27, 4, 10, ["rank 0 core 3 strata:81 kernel fail_kernel: kernel returned with scalar "
                                         "GM writes not flushed: 1 dirty D-cache line(s) of SetValue data (the "
                                         "lowest at rank 0 heap offset 3072 (0xc00)) never written back"]),
    "lost_write": (28, 2, 10, ["rank 0 core 0 strata:92 kernel fail_kernel: DataCacheCleanAndInvalid: lost "
                               "write: the write-back of this core's dirty 64-byte line at rank 0 heap offset 3072 "
                               "(0xc00) would overwrite bytes 32-60 (8 bytes differ), which another agent"]),
    "cast_mode_at_run_time": (31, 4, 10, ["rank 0 core 3 strata:52 kernel fail_kernel: Cast float->bfloat16_t "
                                          "with CAST_NONE: A2/A3 take CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/"
                                          "CAST_TRUNC only for this pair (asc-devkit docs Cast.md)"]),
    "cast_widening_overlap": (32, 4, 10, [PREFIX + "Cast half->float: dst (UB offset 0, 256 bytes) and src "
                                          "(UB offset 128, 128 bytes) overlap; a widening Cast over overlapping "
                                          "operands may give wrong results on A2/A3"]),
    # SDMA queue depth (256 SQEs, UNVERIFIED model value): the 257th one-SQE post without a quiet
    "sdma_row_posts": (33, 4, 10, ["rank 0 core 3 strata:51 kernel fail_kernel: aclshmemx_sdma_put_nbi: SDMA "
                                   "queue of core 3 holds 257 SQEs > depth 256: quiet earlier (256 SQEs since "
                                   "the last aclshmemx_sdma_quiet + 1 for this 32-byte post"]),
    # a 3 MiB post is 3 SQEs: 254 + 3 > 256
    "sdma_big_post": (34, 4, 10, [PREFIX + "aclshmemx_sdma_put_nbi: SDMA queue of core 3 holds 257 SQEs > depth "
                                  "256: quiet earlier (254 SQEs since the last aclshmemx_sdma_quiet + 3 for "
                                  "this 3145728-byte post"]),
    "sdma_overlap": (48, 4, 10, [PREFIX + "aclshmemx_sdma_put_nbi: source and destination of this 256-byte copy "
                                 "overlap by 224 bytes (destination after the source by 32 bytes): what an SDMA "
                                 "engine does with an overlapping copy is not documented, so the model refuses it"]),
    "event_set_set": (35, 4, 10, [PREFIX + "SetFlag<HardEvent::S_MTE3>(2): set-set: the flag is already set and "
                                  "not yet waited for (held by nobody)"]),
    "event_queue_collision": (36, 4, 10, [PREFIX + "aclshmemx_sdma_put_nbi(sync_id)<HardEvent::MTE3_MTE2>(0): "
                                          "set-set", "held by a TQue (EnQue'd or freed buffer)"]),
    "signal_add_default_ub": (37, 4, 10, [PREFIX + "aclshmemx_signal_op(ACLSHMEM_SIGNAL_ADD) stages through "
                                          "SHMEM's MTE UB region [0, 16384) but TPipe has carved UB [0, 4096)"]),
    "event_ids_exhausted": (38, 4, 10, [PREFIX + "TPipe::AllocEventID<HardEvent::MTE3_MTE2>: no free event id "
                                        "(0: a TQue (EnQue'd or freed buffer) (set), 1: AllocEventID, "]),
    # operand alignment (asc-devkit 通用说明和约束.md 表2; DataCopy GM<->UB doc)
    "vector_operand_unaligned": (39, 4, 10, [PREFIX + "Add: src0 operand at UB offset 4 is not 32-byte aligned: "
                                             "vector and Cast operands must start on a 32-byte boundary of UB"]),
    "muls_dst_unaligned": (40, 4, 10, [PREFIX + "Muls: dst operand at UB offset 16 is not 32-byte aligned"]),
    "duplicate_unaligned": (41, 4, 10, [PREFIX + "Duplicate: dst operand at UB offset 4 is not 32-byte aligned"]),
    "cast_operand_unaligned": (42, 4, 10, [PREFIX + "Cast: dst operand at UB offset 1030 is not 32-byte aligned"]),
    # the legal int8 <-> half casts round-trip and round by mode; then an out-of-range half is refused
    "cast_half_int8_out_of_range": (44, 4, 10, ["rank 0 core 3 strata:77 kernel fail_kernel: Cast half->int8_t of "
                                                "200: the value rounds outside [-128, 127]; what A2/A3 give for it "
                                                "is not documented"]),
    "gm_datacopy_unaligned": (43, 4, 10, [PREFIX + "DataCopy: GM address", "is not aligned to its 4-byte element"]),
}


@pytest.mark.parametrize("name", sorted(FAIL_CASES))
def test_rule_violation(driver, tmp_path, name):
    case, cores, timeout, pieces = FAIL_CASES[name]
    lines = run_driver(driver, tmp_path, "fail", case, 1, cores, timeout)[0]
    launch = field(lines, "LAUNCH_FAILED")
    elapsed, message = launch.split(" ", 1)
    for piece in pieces:
        assert piece in message
    assert message.startswith("rank 0 core ")
    # a wait ran into its deadline; otherwise the other cores (waiting in SyncAll) unwound before
    # it (no other wall-clock bound: the machine may be busy)
    if name == "wait_timeout":
        assert float(elapsed) >= timeout, elapsed
    else:
        assert float(elapsed) < timeout, elapsed
    assert field(lines, "aborted") == "1"
    assert field(lines, "abort_message") == message
    assert "RELAUNCH_OK" not in lines   # an aborted pool refuses later launches


def test_unpadded_flags_fail_on_the_rank_whose_flag_shares_a_line(driver, tmp_path):
    """Case 22: two ranks signal flags 4 bytes apart on rank 0 (the packed layout): rank 0's flag
    starts a 64-byte line, rank 1's is 4 bytes into it and is refused."""
    out = run_driver(driver, tmp_path, "fail", 22, 2, 1, 10)
    message = field(out[1], "LAUNCH_FAILED").split(" ", 1)[1]
    assert message.startswith(
        "rank 1 core 0 strata:51 kernel fail_kernel: aclshmemx_signal_op: signal address rank 1 heap offset 3076 "
        "(0xc04), 4 bytes into its 64-byte line is not 64-byte aligned: each signal needs a D-cache line of its "
        "own"), message
    assert "ACLSHMEM_SYNCBIT_SIZE = 64" in message


@pytest.mark.parametrize("flushed", [False, True])
def test_stale_read_of_gm_another_rank_wrote(driver, tmp_path, flushed):
    """Cases 23/24: rank 0 reads x (caching its line), rank 1 overwrites x by DMA, rank 0 reads x
    again: without a flush it is a stale read; with DataCacheCleanAndInvalid it reads 4242."""
    out = run_driver(driver, tmp_path, "fail", 24 if flushed else 23, 2, 1, 10)
    if flushed:
        assert field(out[0], "LAUNCH_OK") and field(out[1], "LAUNCH_OK")
        return
    message = field(out[0], "LAUNCH_FAILED").split(" ", 1)[1]
    assert message.startswith(
        "rank 0 core 0 strata:62 kernel fail_kernel: GlobalTensor::GetValue: stale read: GetValue of GM written "
        "by another agent since this core cached the line: call DataCacheCleanAndInvalid first (asc-devkit "
        "GlobalTensor/GetValue.md); element at rank 0 heap offset 3072 (0xc00), bytes 0-1 (2 bytes differ) of its 64-byte line changed"), message


@pytest.mark.parametrize("case,refused", [(45, True), (46, False), (47, False)])
def test_a_flag_raised_before_the_quiet_of_the_sdma_copy_it_announces(driver, tmp_path, case, refused):
    """Cases 45-47, world 2: rank 0 SDMA-puts 64 floats to rank 1 and signals rank 1, which waits
    and reads them by DataCopy. 45: the signal before the quiet: rank 1's read is refused, whatever
    the timing (SHMEM orders nothing between an SDMA copy and a later signal). 46: quiet, then
    signal: passes. 47: a signal while the copy is posted (as a barrier inside an async stage),
    then the quiet and a second signal, which rank 1 waits for: passes."""
    out = run_driver(driver, tmp_path, "fail", case, 2, 1, 10)
    if not refused:
        assert field(out[0], "LAUNCH_OK") is not None and field(out[1], "LAUNCH_OK") is not None
        return
    message = field(out[1], "LAUNCH_FAILED").split(" ", 1)[1]
    assert message.startswith(
        "rank 1 core 0 strata:88 kernel fail_kernel: DataCopy: reads rank 1 heap offset 0 (0x0), which an SDMA "
        "copy of rank 0 core 0 writes, and the newest signal this rank has seen from rank 0 (its signal 1) was "
        "raised before that copy's aclshmemx_sdma_quiet: a flag raised before the quiet of the SDMA copy it "
        "announces"), message


def test_each_core_writing_its_own_lines_and_flushing_passes(driver, tmp_path):
    """Case 26: as case 25 (two cores, one line), but core 1 writes a line of its own; core 0 reads
    both values back after invalidating."""
    out = run_driver(driver, tmp_path, "fail", 26, 1, 2, 10)
    assert field(out[0], "LAUNCH_OK")


def test_stale_read_of_gm_the_host_changed_between_launches(driver, tmp_path):
    """The core's data cache persists across launches: reads after a flush see each value the host
    wrote; a read without one, of a line cached by the launch before, fails."""
    lines = run_driver(driver, tmp_path, "stale_host")[0]
    launches = [l for l in lines if l.startswith("launch ")]
    assert [l.split(" rc ")[0] for l in launches] == ["launch 0 case 30", "launch 1 case 30", "launch 2 case 29"]
    assert [l for l in lines if l.startswith("read ")] == ["read 100", "read 101"]
    assert launches[0].endswith("rc 0 ") and launches[1].endswith("rc 0 ")
    assert launches[2].startswith(
        "launch 2 case 29 rc -1 rank 0 core 0 strata:101 kernel fail_kernel: GlobalTensor::GetValue: stale read: "
        "GetValue of GM written by another agent since this core cached the line"), launches[2]


@pytest.mark.parametrize("aiv,blocks", [(None, 49), ("40", 41)])
def test_blocks_over_soc_cores(driver, tmp_path, aiv, blocks):
    # numBlocks must not exceed the SoC's vector cores (48 by default, the largest A2/A3 count; 40
    # for an Ascend910B3 through STRATA_CPU_AIV_CORES): the launch is refused before any core runs
    env = {"STRATA_CPU_AIV_CORES": aiv} if aiv else {}
    lines = run_driver(driver, tmp_path, "fail", 8, 1, blocks, 10, env=env)[0]
    message = field(lines, "LAUNCH_FAILED").split(" ", 1)[1]
    assert message == (f"LaunchBlocks(fail_kernel): {blocks} blocks exceed the SoC's {blocks - 1} vector cores "
                       "(numBlocks must not exceed the physical AIV count: SyncAll hangs on the NPU otherwise)")
    assert field(lines, "aborted") == "0"
    ok = run_driver(driver, tmp_path, "fail", 8, 1, blocks - 1, 10, env=env)[0]   # one fewer runs
    assert field(ok, "LAUNCH_OK")


def test_event_alloc_avoids_queue_ids(driver, tmp_path):
    # AllocEventID skips the id a queue holds, so the SDMA sync_id pair runs on every core; the
    # actor then takes the remaining ids and one more AllocEventID fails naming the holders
    lines = run_driver(driver, tmp_path, "fail", 38, 1, 4, 10)[0]
    message = field(lines, "LAUNCH_FAILED").split(" ", 1)[1]
    assert message.startswith(FAIL_CASES["event_ids_exhausted"][3][0])
    assert "7: AllocEventID); ReleaseEventID missing?" in message


def test_peer_abort_propagates(driver, tmp_path):
    out = run_driver(driver, tmp_path, "fail", 17, 3, 4, 30)
    culprit = "rank 1 core 3 strata:77 kernel fail_kernel: DataCopy of 36 bytes is not a multiple of 32 bytes"
    assert field(out[1], "LAUNCH_FAILED").split(" ", 1)[1].startswith(culprit)
    for r in (0, 2):
        elapsed, message = field(out[r], "LAUNCH_FAILED").split(" ", 1)
        assert re.match(rf"rank {r} core \d strata:\? kernel fail_kernel: aclshmem_signal_wait_until aborted: "
                        rf"rank 1 failed: {re.escape(culprit)}", message), message
        assert float(elapsed) < 30, elapsed   # the abort, not the 30 s deadline
    for r in range(3):
        assert field(out[r], "abort_message").startswith(culprit)


# ---------------------------------------------------------------------------------------------
# host API through ctypes (as the Python loader uses it)

@pytest.fixture
def lib(libstratacpu):
    so = ctypes.CDLL(str(libstratacpu))
    so.strata_cpu_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
    so.strata_cpu_last_error.restype = ctypes.c_char_p
    so.strata_cpu_abort_message.restype = ctypes.c_char_p
    so.strata_cpu_heap_base.restype = ctypes.c_void_p
    so.strata_cpu_heap_bytes.restype = ctypes.c_uint64
    so.strata_cpu_heap_used.restype = ctypes.c_uint64
    so.strata_cpu_set_timeout.argtypes = [ctypes.c_double]
    so.strata_cpu_read_counters.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    so.aclshmem_malloc.restype = ctypes.c_void_p
    so.aclshmem_malloc.argtypes = [ctypes.c_size_t]
    so.aclshmem_calloc.restype = ctypes.c_void_p
    so.aclshmem_calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    so.aclshmem_align.restype = ctypes.c_void_p
    so.aclshmem_align.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    so.aclshmem_free.argtypes = [ctypes.c_void_p]
    yield so
    so.strata_cpu_finalize(1)  # harmless when the test already finalised


def _name(tag: str) -> bytes:
    return f"/strata_pytest_{os.getpid()}_{tag}".encode()


def test_allocator_first_fit_coalescing_and_exhaustion(lib):
    # aclshmem_align(512, n), as stratac's hosts allocate: 512-byte aligned, n rounded up to 512
    assert lib.strata_cpu_init(0, 1, _name("alloc"), 65536, 1) == 0
    base = lib.strata_cpu_heap_base()
    off = lambda p: p - base
    a = lib.aclshmem_align(512, 100)
    b = lib.aclshmem_align(512, 600)
    c = lib.aclshmem_align(512, 1)
    assert [off(a), off(b), off(c)] == [0, 512, 1536]
    lib.aclshmem_free(b)
    d = lib.aclshmem_align(512, 512)
    e = lib.aclshmem_align(512, 1000)
    assert [off(d), off(e)] == [512, 2048]   # first fit: the hole, then past it
    lib.aclshmem_free(d)
    f = lib.aclshmem_align(512, 1024)
    assert off(f) == 512                     # freed block coalesced with the 512-byte remainder
    assert lib.strata_cpu_heap_used() == 512 + 1024 + 512 + 1024
    for p in (a, c, e, f):
        lib.aclshmem_free(p)
    assert lib.strata_cpu_heap_used() == 0
    whole = lib.aclshmem_align(512, 65536)       # everything coalesced back into one block
    assert off(whole) == 0
    assert lib.aclshmem_align(512, 1) is None
    msg = lib.strata_cpu_last_error().decode()
    assert "aclshmem_align(1)" in msg and "0 bytes free" in msg
    lib.aclshmem_free(whole)
    assert lib.aclshmem_align(512, 70000) is None
    msg = lib.strata_cpu_last_error().decode()
    assert "aclshmem_align(70000)" in msg and "65536 bytes free" in msg
    lib.aclshmem_free(ctypes.c_void_p(base + 4))
    assert "not a live allocation" in lib.strata_cpu_last_error().decode()
    # calloc zeroes; the same calls on a fresh pool give the same offsets
    p = lib.aclshmem_calloc(10, 100)
    assert off(p) == 0 and ctypes.string_at(p, 1000) == bytes(1000)
    assert lib.strata_cpu_finalize(1) == 0
    assert lib.strata_cpu_init(0, 1, _name("alloc2"), 65536, 1) == 0
    base2 = lib.strata_cpu_heap_base()
    got = [lib.aclshmem_align(512, s) - base2 for s in (100, 600, 1)]
    assert got == [0, 512, 1536]
    assert lib.strata_cpu_finalize(1) == 0


def test_malloc_aligns_to_16_bytes_only_as_shmem_does(lib):
    """SHMEM's aclshmem_malloc aligns to 16 bytes (src/host/mem/shmem_mgr.cpp:241-245, audit 2 #11), so
    the model's does too: a host that needs a 64-byte signal line or a 32-byte DMA block must ask
    aclshmem_align, whose skipped bytes stay free."""
    assert lib.strata_cpu_init(0, 1, _name("malloc16"), 65536, 1) == 0
    base = lib.strata_cpu_heap_base()
    got = [lib.aclshmem_malloc(s) - base for s in (100, 600, 1)]
    assert got == [0, 112, 720]                       # 100 -> 112, 600 -> 608, 1 -> 16: 16-byte steps
    assert lib.aclshmem_align(64, 10) - base == 768   # 736 is not 64-byte aligned: skipped, still free
    assert lib.aclshmem_malloc(16) - base == 736
    assert lib.aclshmem_calloc(1, 8) - base == 752    # the rest of the skipped bytes (first fit)
    assert lib.aclshmem_malloc(16) - base == 832      # after the 64-aligned block of 64 bytes
    assert lib.aclshmem_align(48, 64) is None
    assert "must be a power of two no larger than 512" in lib.strata_cpu_last_error().decode()
    assert lib.aclshmem_align(1024, 64) is None
    assert lib.strata_cpu_finalize(1) == 0


def test_pool_lifecycle_and_host_api(lib):
    name = _name("pool")
    assert lib.strata_cpu_init(0, 2, name, 1000, 1) == -1
    assert "multiple of 512" in lib.strata_cpu_last_error().decode()
    assert lib.strata_cpu_init(0, 1, name, 8192, 1) == 0
    assert lib.strata_cpu_heap_bytes() == 8192
    first = lib.strata_cpu_current_pool()
    assert first > 0
    # a second pool beside it (another communicator of this process): current until another is
    # selected; each keeps its own heap size and allocator
    other = _name("pool2")
    assert lib.strata_cpu_init(0, 1, other, 16384, 1) == 0
    second = lib.strata_cpu_current_pool()
    assert second not in (0, first) and lib.strata_cpu_heap_bytes() == 16384
    assert lib.aclshmem_malloc(4096) - lib.strata_cpu_heap_base() == 0
    assert lib.strata_cpu_select_pool(first) == 0 and lib.strata_cpu_heap_bytes() == 8192
    assert lib.aclshmem_malloc(4096) - lib.strata_cpu_heap_base() == 0    # its own allocator
    assert lib.strata_cpu_heap_used() == 4096
    assert lib.strata_cpu_select_pool(second + 100) == -1
    assert "no such pool in this process" in lib.strata_cpu_last_error().decode()
    assert lib.strata_cpu_current_pool() == first
    assert lib.strata_cpu_select_pool(second) == 0 and lib.strata_cpu_finalize(1) == 0
    assert lib.strata_cpu_current_pool() == 0 and lib.strata_cpu_heap_bytes() == 0
    assert lib.strata_cpu_select_pool(second) == -1                      # gone with its finalize
    assert lib.strata_cpu_select_pool(first) == 0
    lib.aclshmem_free(ctypes.c_void_p(lib.strata_cpu_heap_base()))
    assert lib.strata_cpu_barrier() == 0                        # world 1: passes at once
    assert lib.strata_cpu_aborted() == 0 and lib.strata_cpu_abort_message() == b""
    lib.strata_cpu_reset_counters()
    buf = (ctypes.c_uint64 * (64 * 7))()   # STRATA_NUM_CTRS = 7 slots per core
    assert lib.strata_cpu_read_counters(buf, 64) == 0 and sum(buf) == 0
    # the SoC's vector core count: 1..48 (A2/A3 have 40 or 48)
    assert lib.strata_cpu_set_aiv_cores(49) == -1 and lib.strata_cpu_set_aiv_cores(0) == -1
    assert "outside [1, 48]" in lib.strata_cpu_last_error().decode()
    assert lib.strata_cpu_set_aiv_cores(40) == 0 and lib.strata_cpu_set_aiv_cores(48) == 0
    lib.strata_cpu_set_timeout(5.0)
    assert lib.strata_cpu_finalize(0) == 0
    # the segment still exists: O_EXCL creation fails, opening works and checks the geometry
    assert lib.strata_cpu_init(0, 1, name, 8192, 1) == -1
    assert "File exists" in lib.strata_cpu_last_error().decode()
    assert lib.strata_cpu_init(0, 1, name, 16384, 0) == -1
    assert lib.strata_cpu_init(0, 1, name, 8192, 0) == 0
    mode = os.stat("/dev/shm" + name.decode()).st_mode & 0o777
    assert mode == 0o600
    assert lib.strata_cpu_finalize(1) == 0
    assert not os.path.exists("/dev/shm" + name.decode())


# ---------------------------------------------------------------------------------------------
# what a wait that never completes says (STRATA_WAIT_NOTE, strata_cpu_describe_sync), dead ranks

def test_barrier_timeout_names_the_rank_that_never_arrived(driver, tmp_path):
    """Case 20: a barrier as strata_device.h's Barrier does it (with STRATA_WAIT_NOTE) on 3 ranks x
    2 cores; rank 2 never arrives. Ranks 0 and 1 stop at the 0.5 s deadline naming its slot."""
    out = run_driver(driver, tmp_path, "fail", 20, 3, 2, 0.5)
    times = []
    for r in (0, 1):
        elapsed, message = field(out[r], "LAUNCH_FAILED").split(" ", 1)
        times.append(float(elapsed))
        # its own timeout, or the abort of the rank that timed out first (which quotes it)
        assert re.search(r"rank ([01]) core 0 strata:31 kernel fail_kernel: aclshmem_signal_wait_until timed out "
                         r"after 0.5 s: barrier slot of rank 2 \(flag at rank \1 heap offset 1152 \(0x480\)\): "
                         r"ACLSHMEM_CMP_GE \(expected >= 5\), seen 0 \(never signalled\); ranks that have not "
                         r"arrived at this barrier: 2$", message), message
    assert max(times) >= 0.5, times   # the first to give up waited its whole deadline
    assert field(out[2], "LAUNCH_OK")


def test_named_flag_timeout_names_the_flag_the_slot_and_what_is_missing(driver, tmp_path):
    """Case 21: the sync area is described (barrier slots, then go[4]); go[1] holds this call's
    stamp, go[2] an earlier one: the wait for go[2] names it and the slots still below the stamp."""
    out = run_driver(driver, tmp_path, "fail", 21, 1, 4, 0.5)
    message = field(out[0], "LAUNCH_FAILED").split(" ", 1)[1]
    assert message == ("rank 0 core 3 strata:44 kernel fail_kernel: aclshmem_signal_wait_until timed out after "
                       "0.5 s: flag go[2] (flag at rank 0 heap offset 2240 (0x8c0)): ACLSHMEM_CMP_GE (expected "
                       ">= 5), seen 3 (an earlier stamp); slots of go on rank 0 not yet signalled in this call: "
                       "0, 2, 3 (of 4)")


CHILD = """
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.strata_cpu_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
assert lib.strata_cpu_init(1, 2, sys.argv[2].encode(), 65536, 0) == 0
print("JOINED", flush=True)
if sys.argv[3] == "leave":
    lib.strata_cpu_finalize(0)
    sys.exit(0)
time.sleep(60)
"""


def _join_child(libstratacpu, name: bytes, how: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(libstratacpu), name.decode(), how],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "JOINED"
    return child


def test_a_dead_rank_is_detected_and_a_departed_one_is_not(lib, libstratacpu):
    """Rank 1 in another process: while it lives, no rank is dead; SIGKILLed (a zombie until we
    reap it, then gone) it is reported by strata_cpu_dead_rank and ends a host barrier at once,
    aborting the pool. A rank that left through strata_cpu_finalize is not dead: a barrier waiting
    for it runs into its deadline and names it."""
    lib.strata_cpu_dead_rank.restype = ctypes.c_int
    name = _name("dead")
    assert lib.strata_cpu_init(0, 2, name, 65536, 1) == 0
    lib.strata_cpu_set_timeout(30.0)
    child = _join_child(lib_path := libstratacpu, name, "sleep")
    try:
        assert lib.strata_cpu_dead_rank() == -1
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30            # the pool's timeout: the case's one deadline
        while lib.strata_cpu_dead_rank() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lib.strata_cpu_last_error().decode() == (
            f"rank 1 is gone: process {child.pid} has exited (a zombie, not yet reaped) (killed or crashed) "
            "without leaving the pool")
        t0 = time.monotonic()
        assert lib.strata_cpu_barrier() == -1
        assert time.monotonic() - t0 < 30.0       # ended by the dead rank, not the 30 s deadline
        assert lib.strata_cpu_last_error().decode().startswith("strata_cpu_barrier: rank 0: rank 1 is gone: ")
        assert lib.strata_cpu_aborted() == 1
    finally:
        child.kill()
        child.wait()
    assert lib.strata_cpu_finalize(1) == 0
    # reaped: gone altogether
    name = _name("left")
    assert lib.strata_cpu_init(0, 2, name, 65536, 1) == 0
    lib.strata_cpu_set_timeout(0.3)
    child = _join_child(lib_path, name, "leave")
    child.wait()
    assert lib.strata_cpu_dead_rank() == -1       # it left: not dead
    assert lib.strata_cpu_barrier() == -1
    assert lib.strata_cpu_last_error().decode() == (
        "strata_cpu_barrier: rank 0 timed out after 0.3 s in host barrier 1; ranks that have not arrived: 1")
    assert lib.strata_cpu_finalize(1) == 0
    name = _name("gone")
    assert lib.strata_cpu_init(0, 2, name, 65536, 1) == 0
    child = _join_child(lib_path, name, "sleep")
    child.kill()
    child.wait()
    assert lib.strata_cpu_dead_rank() == 1
    assert lib.strata_cpu_last_error().decode() == (
        f"rank 1 is gone: process {child.pid} no longer exists (killed or crashed) without leaving the pool")
    assert lib.strata_cpu_finalize(1) == 0


@pytest.mark.parametrize("mode,uid", [(0o644, None), (0o600, 4242)])
def test_a_segment_someone_else_could_have_made_is_refused(lib, mode, uid):
    if uid is not None and os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    name = _name("planted")
    path = "/dev/shm" + name.decode()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
    try:
        os.ftruncate(fd, 128 * 1024 + 65536)
        os.fchmod(fd, mode)
        if uid is not None:
            os.fchown(fd, uid, uid)
        assert lib.strata_cpu_init(0, 1, name, 65536, 0) == -1
        owner = uid if uid is not None else os.geteuid()
        assert lib.strata_cpu_last_error().decode() == (
            f"strata_cpu_init: refusing segment {name.decode()}: it is owned by uid {owner} with mode {mode:04o}, "
            f"but a pool must belong to this user (uid {os.geteuid()}) with mode 0600 (was it created by "
            "someone else?)")
    finally:
        os.close(fd)
        os.unlink(path)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [(8 << 20) // 4 + 7, (8 << 20) // 4 - 9])
def test_a_large_sdma_post_lands_every_byte_streamed_or_not(driver, tmp_path, n):
    """Posts of 8 MiB and more are copied with non-temporal stores (runtime/cpu/src/sdma.cpp
    StreamBytes), smaller ones with memmove: either way a put to a destination 20 bytes off a
    64-byte line lands exactly its n floats, nothing before or after them."""
    skew = 5
    run_driver(driver, tmp_path, "big_put", n, skew)
    for r in range(2):
        peer = 1 - r
        dst = np.fromfile(tmp_path / f"big_put_dst_{r}.bin", dtype=np.float32)
        want = np.zeros(n + skew + 1)
        want[skew:skew + n] = peer * 4000000 + np.arange(n, dtype=np.float64)
        np.testing.assert_array_equal(dst, want)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", [None, "1"])
def test_sdma_copies_land_while_the_core_waits(driver, tmp_path, threads):
    """Rank 0's cores SDMA-put data and then a flag to rank 1 and wait for rank 1's acknowledgement
    before quieting; rank 1 waits for the flag, copies what arrived, acknowledges. The copies must
    complete without a quiet, as an engine's would: with 2 cores on 1 thread (STRATA_CPU_THREADS=1,
    oversubscribed: the posts do not wake the engine thread) the waiting core runs them; by default
    (a thread per core) the engine or the waiting core does. What rank 1 saw equals rank 0's data."""
    C, n = 2, 256
    env = {"STRATA_CPU_THREADS": threads} if threads else {}
    run_driver(driver, tmp_path, "progress", C, n, env=env)
    for launch in range(2):   # the second launch finds the engine threads asleep
        got = np.fromfile(tmp_path / f"progress_got_{launch}.bin", dtype=np.float32)
        assert np.array_equal(got, np.arange(C * n, dtype=np.float32)), launch


# persistent workers: a process keeps its core and SDMA threads from launch to launch

@pytest.mark.parametrize("threads", [None, 1, 3])
def test_workers_are_reused_across_launches(driver, tmp_path, threads):
    """31 launches with core counts between 1 and 8 on 2 ranks, every result checked; the process
    then has main + T-1 worker threads (a launch of C cores runs on T = min(C, CPUs or
    STRATA_CPU_THREADS) threads, the launching one included, its cores as fibers) + 8 SDMA engines,
    whatever the number of launches. Counters and trace of a narrower launch after wider ones show
    only its 3 cores. strata_cpu_finalize joins the workers; the pool opened again starts as many as
    its launch needs."""
    world, n = 2, 300
    env = {"STRATA_CPU_THREADS": str(threads)} if threads else {}
    out = run_driver(driver, tmp_path, "reuse", world, n, env=env)
    t = threads or len(os.sched_getaffinity(0))
    assert sorted(out) == list(range(world))
    chunk = 4 * n
    for r in range(world):
        lines = out[r]
        launches = [l for l in lines if l.startswith("exchange ")]
        assert len(launches) == 31 and all(l.endswith(" bad 0") for l in launches), launches
        assert int(field(lines, "threads_pool")) == 1 + (min(t, 8) - 1) + 8
        assert int(field(lines, "threads_after_finalize")) == 1
        assert field(lines, "again exchange 4 bad") == "0"
        assert int(field(lines, "threads_again")) == 1 + (min(t, 4) - 1) + 4
        assert int(field(lines, "cores")) == 3
        for c in range(3):
            got = [int(v) for v in field(lines, f"counters {c}").split()]
            # ... and world puts + 1 get, each one SQE (chunk < 1 MiB)
            assert got == [chunk, world * chunk, (world + 1) * chunk, chunk, 2 * (world - 1) * chunk,
                           world + 1, world + 1]
        events = [json.loads(l) for l in (tmp_path / f"reuse_trace_{r}.jsonl").read_text().splitlines()]
        assert {e["pid"] for e in events} == {r}
        kernels = sorted(e["tid"] for e in events if e["cat"] == "kernel")
        assert kernels == [0, 1, 2]
        assert all(e["name"] == "exchange_kernel" and e["args"] == {} for e in events if e["cat"] == "kernel")
        copies = Counter(e["tid"] for e in events if e["cat"] == "sdma")
        assert copies == {1000 + c: world + 1 for c in range(3)}   # W puts and a get per core


def test_a_launch_after_a_failed_launch_works(driver, tmp_path):
    """A failed launch (a rule broken while the other cores wait in SyncAll; a core returning with
    a slow SDMA copy in flight; a core returning while the others wait in SyncAll) leaves its pool
    refusing launches; the process's next pool launches and computes correctly."""
    out = run_driver(driver, tmp_path, "relaunch", env={"STRATA_CPU_SDMA_DELAY_US": "20000"})[0]
    expect = {1: "DataCopy of 36 bytes is not a multiple of 32 bytes",
              6: "kernel returned with 1 SDMA copies not waited for by aclshmemx_sdma_quiet",
              15: "SyncAll can never complete: core 0 returned from the kernel without reaching it"}
    for which, piece in expect.items():
        rc = field(out, f"case {which} rc")
        assert rc.startswith("-1 rank 0 core ") and piece in rc, rc
        assert field(out, f"case {which} refused") == "1"
        assert field(out, f"case {which} then exchange bad") == "0"


# the start of a child process that loads the model and the test kernels (argv: the two libraries,
# then the pool name)
CHILD_HEAD = """
import ctypes, os, sys
model = ctypes.CDLL(sys.argv[1])
kernels = ctypes.CDLL(sys.argv[2])
model.strata_cpu_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
model.aclshmem_calloc.restype = ctypes.c_void_p
model.aclshmem_calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
"""


EXIT_CHILD = CHILD_HEAD + """
import time
kernels.launch_syncall.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32]
assert model.strata_cpu_init(0, 1, sys.argv[3].encode(), 1 << 20, 1) == 0
slots = model.aclshmem_calloc(8 * 16, 4)   # one 64-byte line per core (syncall_kernel)
sums = model.aclshmem_calloc(8 * 16, 4)    # per core: rounds padded to 16 int32
for cores in (8, 3, 8):
    assert kernels.launch_syncall(cores, slots, sums, 10) == 0
threads = lambda: len(os.listdir("/proc/self/task"))
print("threads", threads(), flush=True)
how = sys.argv[4]
if how == "finalize":
    assert model.strata_cpu_finalize(0) == 0
    print("threads", threads(), flush=True)
elif how == "dlclose":
    import _ctypes
    model.strata_cpu_leave()
    _ctypes.dlclose(kernels._handle)
    _ctypes.dlclose(model._handle)
    # unloaded, the workers were joined first; their tasks leave /proc a moment after the join
    deadline = time.monotonic() + 30
    while sys.argv[1] not in open("/proc/self/maps").read() and threads() != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("threads", threads(), flush=True)
    print("mapped", sys.argv[1] in open("/proc/self/maps").read(), flush=True)
# "exit": leave with the workers idle, no finalize
"""


UB_FRESH_CHILD = CHILD_HEAD + """
kernels.launch_ub_paths.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                    ctypes.c_uint32, ctypes.c_uint32]
assert model.strata_cpu_init(0, 1, sys.argv[3].encode(), 8 << 20, 1) == 0
full = 192 * 1024
out = model.aclshmem_calloc(4 * full, 1)
zeros = model.aclshmem_calloc(full, 1)
# (cores, carve, dirty): small and large carves, fewer and more cores than before, the whole UB
for step, (cores, carve, dirty) in enumerate([(2, 4096, 4096), (3, 65536, 32768), (1, full, full),
                                              (4, 1024, 1024), (4, full, 0), (2, 8192, 8192), (2, 65536, 0)]):
    ctypes.memset(out, 0, 4 * full)
    assert kernels.launch_ub_paths(cores, out, zeros, carve, dirty, 0) == 0, step   # 0: Duplicate
    seen = ctypes.string_at(out, cores * carve)
    bad = [i for i, b in enumerate(seen) if b != 0xFF]
    print("step", step, "cores", cores, "carve", carve, "not_ff", len(bad), bad[:4], flush=True)
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_every_launch_finds_ub_filled_with_0xff(driver, libstratacpu, threads):
    """UB starts as garbage (0xff) at every launch, although a launch refills only the bytes that
    earlier launches of the core carved (TPipe::InitBuffer -> UbCarve): each launch copies its
    carved UB to GM before writing and zeroes some of it, and the next launch, with more or fewer
    cores and a larger or smaller carve, still finds only 0xff; cores run as fibers (1 thread) or
    not."""
    name = _name(f"ub_fresh_{threads}")
    try:
        proc = subprocess.run([sys.executable, "-c", UB_FRESH_CHILD, str(libstratacpu),
                               str(driver.parent / "libtestkernels.so"), name.decode()],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "STRATA_CPU_THREADS": threads})
    finally:
        if os.path.exists("/dev/shm" + name.decode()):
            os.unlink("/dev/shm" + name.decode())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [l for l in proc.stdout.splitlines() if l.startswith("step ")]
    assert len(steps) == 7, proc.stdout
    assert all(" not_ff 0 []" in l for l in steps), steps


UB_PATHS_CHILD = CHILD_HEAD + """
kernels.launch_ub_paths.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                    ctypes.c_uint32, ctypes.c_uint32]
assert model.strata_cpu_init(0, 1, sys.argv[3].encode(), 8 << 20, 1) == 0
how = int(sys.argv[4])
full = 192 * 1024
out = model.aclshmem_calloc(4 * full, 1)
zeros = model.aclshmem_calloc(full, 1)
# a first launch that writes nothing (the arenas' first fill), one that writes the first 40 KiB of a
# 64 KiB carve by path `how`, then one that only reads what it finds
for step, (carve, dirty) in enumerate([(65536, 0), (65536, 40960), (65536, 0)]):
    ctypes.memset(out, 0, 4 * full)
    assert kernels.launch_ub_paths(2, out, zeros, carve, dirty, how) == 0, step
    seen = ctypes.string_at(out, 2 * carve)
    bad = [i for i, b in enumerate(seen) if b != 0xFF]
    print("step", step, "not_ff", len(bad), bad[:4], flush=True)
"""


@pytest.mark.parametrize("how", range(9))
def test_ub_written_by_any_path_is_refilled(driver, libstratacpu, how):
    """A launch refills only the UB chunks written since the last refill (runtime/cpu/src/ub.cpp g_ub_dirty), so
    every way a kernel writes UB must be seen: Duplicate, DataCopy GM -> UB, Add, SetValue, a raw
    store through GetPhyAddr, Cast, operator(), DataCopyPad, DataCopy UB -> UB. The launch after the
    one that wrote finds 0xff everywhere."""
    name = _name(f"ub_paths_{how}")
    try:
        proc = subprocess.run([sys.executable, "-c", UB_PATHS_CHILD, str(libstratacpu),
                               str(driver.parent / "libtestkernels.so"), name.decode(), str(how)],
                              capture_output=True, text=True, timeout=60)
    finally:
        if os.path.exists("/dev/shm" + name.decode()):
            os.unlink("/dev/shm" + name.decode())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [l for l in proc.stdout.splitlines() if l.startswith("step ")]
    assert steps == [f"step {i} not_ff 0 []" for i in range(3)], proc.stdout


@pytest.mark.parametrize("how", ["exit", "finalize", "dlclose"])
def test_idle_workers_do_not_hold_up_exit_or_unloading(driver, libstratacpu, how):
    """After launches, a process exits promptly with or without strata_cpu_finalize (at exit the
    model joins its idle workers). dlclose does not unmap the model (it holds a unique symbol, so
    the loader keeps it): should it ever, its unloading joins the workers before its code goes."""
    name = _name(f"exit_{how}")
    try:
        proc = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(libstratacpu),
                               str(driver.parent / "libtestkernels.so"), name.decode(), how],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "STRATA_CPU_THREADS": "8"})
    finally:
        if os.path.exists("/dev/shm" + name.decode()):
            os.unlink("/dev/shm" + name.decode())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # 8 cores on 8 threads: main (thread 0 of every launch) + 7 workers (no SDMA copies)
    assert lines[0] == "threads 8"
    if how == "finalize":
        assert lines[1] == "threads 1"
    if how == "dlclose":
        assert lines[1:] in (["threads 8", "mapped True"], ["threads 1", "mapped False"])
