"""The values the tools' command lines take: world lists, byte sizes, sweeps, routings.

In: the text of one command-line value. Out: the parsed value, or ValueError /
argparse.ArgumentTypeError with a message that names the value. Shared by stratac.cli and the
tools (bench, simulate), so that every command reads `64M` or `16:1024` the same way.
"""

from __future__ import annotations

import argparse
import re

from stratac.verify.samples import MAX_WORLD

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 8, 64K, 256M)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _parse_range(text: str, one, what: str) -> list[int]:
    """The sweep syntax shared by --sizes and --tokens: MIN:MAX doubling, MIN:MAX:F, a comma list
    of values or ranges (the union, sorted); `one` parses a single value."""
    out: set[int] = set()
    for part in text.split(","):
        bits = part.split(":")
        if len(bits) == 1:
            out.add(one(bits[0]))
            continue
        if len(bits) > 3:
            raise ValueError(f"{part!r}: a range is MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = one(bits[0]), one(bits[1])
        try:
            f = int(bits[2]) if len(bits) == 3 else 2
        except ValueError:
            raise ValueError(f"{part!r}: the FACTOR of MIN:MAX:FACTOR is an integer") from None
        if lo < 1 or hi < lo or f < 2:
            raise ValueError(f"{part!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        s = lo
        while s <= hi:
            out.add(s)
            s *= f
    if not out or min(out) < 1:
        raise ValueError(f"{text!r}: {what} must be at least 1")
    return sorted(out)


def parse_sizes(text: str) -> list[int]:
    """'8:256M' -> 8, 16, ..., 256 MiB (doubling, like nccl-tests -b 8 -e 256M -f 2);
    'MIN:MAX:F' multiplies by F; a comma list of sizes or ranges is the union, sorted."""
    return _parse_range(text, _size, "sizes (bytes)")


def _count(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KM]?)\s*", text, re.I)
    if not m:
        raise ValueError(f"{text!r} is not a token count (e.g. 16, 1024, 4K)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_counts(text: str) -> list[int]:
    """Tokens per rank for a MoE sweep, in the --sizes syntax: '16:1024' -> 16, 32, ..., 1024;
    'MIN:MAX:F'; a comma list. K = 1024 tokens."""
    return _parse_range(text, _count, "token counts")


def parse_routings(text: str) -> list[str]:
    """'skewed' -> ['skewed']; 'uniform,single' -> both, in the order given; 'all' -> every routing
    stratac.verify.routing knows (uniform, skewed, single, empty, sparse)."""
    from stratac.verify.routing import ROUTINGS
    out: list[str] = []
    for name in (x.strip() for x in text.split(",")):
        names = list(ROUTINGS) if name == "all" else [name]
        for n in names:
            if n not in ROUTINGS:
                raise ValueError(f"unknown routing {n!r}; known: {', '.join(ROUTINGS)}, or all")
            if n not in out:
                out.append(n)
    return out


_TOO_LARGE = (f"is above {MAX_WORLD:,}, the largest world stratac verifies (the Atlas 960 SuperPoD's "
              "15,488 NPUs, rounded up)")
# The most ranks `run`, `bench` and `tune` start on this machine (one process each); above it a
# world is proven with `check`, predicted with `simulate`, and run on the machine itself.
MAX_RUN_WORLD = 384


# The most world sizes one `check` or `compile` proves: each is a proof of its own, one after
# another; more is a request nobody means (1-16384 would run for days), refused at once.
MAX_WORLDS_LISTED = 512


def world_list(text: str) -> list[int]:
    """World sizes for `check` and `compile`: 2,3,4, 1-8 or a mix, each 1 to MAX_WORLD, at most
    MAX_WORLDS_LISTED of them."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of world sizes (e.g. 2,3,4 or 1-8)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi < lo:
            raise argparse.ArgumentTypeError(f"bad world size range {part!r}")
        if hi > MAX_WORLD:   # before the range is built: 1-10000000000 must not allocate it
            raise argparse.ArgumentTypeError(f"world {hi} {_TOO_LARGE}")
        if len(out) + hi - lo + 1 > MAX_WORLDS_LISTED:   # before a long list is built
            raise argparse.ArgumentTypeError(
                f"{text!r} asks for more than {MAX_WORLDS_LISTED} world sizes, each a proof of its own, "
                "one after another; ask for the worlds you run (e.g. 1-16,64,384,8192)")
        out.extend(range(lo, hi + 1))
    return out


def world_verified(text: str) -> int:
    """One world size that `check` could prove (`simulate` predicts those): 1 to MAX_WORLD."""
    v = positive_int(text)
    if v > MAX_WORLD:
        raise argparse.ArgumentTypeError(f"world {v} {_TOO_LARGE}")
    return v


def world_size(text: str) -> int:
    """One world size, as `run` and `bench` start it: 1 to MAX_RUN_WORLD."""
    v = positive_int(text)
    if v > MAX_RUN_WORLD:
        raise argparse.ArgumentTypeError(f"world {v} is above {MAX_RUN_WORLD}, the most ranks stratac "
                                         "starts on this machine (check proves larger worlds, "
                                         "simulate predicts them)")
    return v


def ranges_text(xs: list[int]) -> str:
    """[1, 2, 3, 4, 8] -> '1-4,8'."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(f"{xs[i]}-{xs[j]}" if j > i + 1 else ",".join(map(str, xs[i:j + 1])))
        i = j + 1
    return ",".join(out)


def byte_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64K, 64M, 1G)")
    mult = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[(m.group(2) or "")[:1].lower()]
    return int(m.group(1)) * mult


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def param_value(text: str) -> tuple[str, int]:
    """NAME=D, a divisor parameter's value (`stratac run --param node=4`)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name.strip(), positive_int(value.strip())


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return v


def size_sweep(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def token_sweep(text: str) -> list[int]:
    try:
        return parse_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def routing_list(text: str) -> list[str]:
    try:
        return parse_routings(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
