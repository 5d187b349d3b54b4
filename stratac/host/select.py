"""One entry point per collective: a Module's schedules that implement one contract, picked per
call by message bytes and world from a selection table (`stratac tune` writes it).

In: the loaded schedules of a file and a selection table (a JSON file, docs/api.md "One entry
point per collective"). Out: a `Selector` per contract kind (`mod.allreduce(x, op="sum")`) that
runs the candidate the table ranks first for the call's bytes and world.

The table: {"stratac_selection": 1, "provenance": {...}, "entries": [{"kind", "world", "dtype",
"method", "rows": [{"upto": BYTES or null, "order": [schedule, ...]}], "crossovers": [...]}]}.
A row covers sizes up to `upto` bytes (nccl-tests' S; null: any larger); `order` is fastest
first. Without an entry for the contract and world (no table, or the table names none of the
file's schedules), the default rule decides: up to SMALL_BYTES the candidate with the fewest
synchronisations and statements (latency), above it the file's first candidate of the call's
form without scratch buffers (bandwidth; a staging baseline last).

Forms: a call `sel(x)` is in place, `sel(x, out)` out of place. A candidate of the call's form
runs as is. For AllReduce and Broadcast, whose input and output have one shape, a candidate of the
other form runs through a copy (in place through an out-of-place one: into a heap buffer kept per
size, then copied back; out of place through an in-place one: x copied into out first), but only
up to SMALL_BYTES, where the copy costs microseconds; above that the best candidate of the call's
own form is taken.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from stratac import ir
from stratac.host.errors import StrataUsageError

TABLE_VERSION = 1
SMALL_BYTES = 64 << 10
SAME_SHAPE = {ir.ContractKind.ALLREDUCE, ir.ContractKind.BROADCAST}
TABLE_FILE = "selection.json"


def default_table_path() -> Path:
    """Where `stratac tune` writes this machine's table unless told otherwise, and where a Module
    looks for it: $STRATAC_CACHE_DIR/selection.json (default ~/.cache/stratac)."""
    from stratac.targets.cpu import cache_root
    return cache_root() / TABLE_FILE


def load_table(selection) -> dict | None:
    """selection: a path, a table (dict), False (none: the default rule), or None (the default
    table if there is one)."""
    if selection is False:
        return None
    if isinstance(selection, dict):
        table = selection
        where = "the selection table given"
    else:
        path = Path(selection) if selection is not None else default_table_path()
        if selection is None and not path.exists():
            return None
        where = str(path)
        try:
            table = json.loads(path.read_text())
        except FileNotFoundError:
            raise StrataUsageError(f"selection table {path} does not exist (write it with `stratac tune "
                                   "FILE --world W --out TABLE`)") from None
        except (OSError, ValueError) as exc:
            raise StrataUsageError(f"selection table {path} cannot be read: {exc}") from None
    if not isinstance(table, dict) or table.get("stratac_selection") != TABLE_VERSION \
            or not isinstance(table.get("entries"), list):
        raise StrataUsageError(f"{where} is not a stratac selection table (version {TABLE_VERSION}, "
                               "as `stratac tune` writes)")
    for e in table["entries"]:
        rows = e.get("rows") if isinstance(e, dict) else None
        if not (isinstance(rows, list) and rows and all(isinstance(r.get("order"), list) for r in rows)
                and isinstance(e.get("world"), int) and isinstance(e.get("kind"), str)):
            raise StrataUsageError(f"{where}: an entry lacks kind, world or rows with an order: {e!r}")
    return table


def ranking(table: dict | None, kind: str, world: int, nbytes: int, names: set[str]) -> list[str] | None:
    """The table's candidates for a call, fastest first, restricted to `names`; None without an
    entry that names any of them."""
    if not table:
        return None
    for e in table["entries"]:
        if e["kind"] != kind or e["world"] != world:
            continue
        for row in e["rows"]:
            if row.get("upto") is None or nbytes <= row["upto"]:
                order = [n for n in row["order"] if n in names]
                if order:
                    return order
                break
    return None


def merge(table: dict | None, entries: list[dict], provenance: dict) -> dict:
    """A table with `entries` replacing those of the same kind, world and dtype."""
    old = table["entries"] if table else []
    keys = {(e["kind"], e["world"], e.get("dtype")) for e in entries}
    kept = [e for e in old if (e["kind"], e["world"], e.get("dtype")) not in keys]
    return {"stratac_selection": TABLE_VERSION, "provenance": provenance,
            "entries": sorted(kept + entries, key=lambda e: (e["kind"], e["world"], e.get("dtype") or ""))}


class Selector:
    """`mod.<contract>(x[, out], op=..., root=..., cores=None)`: runs the candidate the selection
    table (or the default rule) picks for these bytes and this world; `last` names it."""

    def __init__(self, module, kind: ir.ContractKind, candidates: list, table: dict | None):
        self.module, self.kind, self.candidates = module, kind, candidates
        self.table = table
        self.name = kind.value
        self.last: str | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._chosen: dict[tuple, tuple] = {}   # choose() per (table, world, bytes, form)
        self._names = {fn.name for fn in candidates}
        self.__doc__ = (f"{kind.value}(x[, out], ...): picks one of {', '.join(sorted(self._names))} "
                        "by message bytes and world (stratac.host.select)")

    @staticmethod
    def in_place(fn) -> bool:
        return fn.ir.contract.in_place

    def choose(self, nbytes: int, in_place: bool) -> tuple:
        """(the schedule, whether it runs through a copy) for a call of nbytes in this form."""
        world = self.module.comm.world
        order = ranking(self.table, self.kind.value, world, nbytes, self._names)
        by_name = {fn.name: fn for fn in self.candidates}
        if order is None:
            order = [fn.name for fn in self._default_order(nbytes)]
        ranked = [by_name[n] for n in order]
        same = [fn for fn in ranked if self.in_place(fn) == in_place]
        adapt_ok = self.kind in SAME_SHAPE and nbytes <= SMALL_BYTES
        if ranked and (adapt_ok or self.in_place(ranked[0]) == in_place):
            return ranked[0], self.in_place(ranked[0]) != in_place
        if same:
            return same[0], False
        if self.kind in SAME_SHAPE and ranked:
            return ranked[0], True
        form = "in place (x only)" if in_place else "out of place (x and out)"
        raise StrataUsageError(f"{self.name}: no schedule of this file implements {self.kind.value} {form}; "
                               f"the candidates are {', '.join(sorted(self._names))}")

    def _default_order(self, nbytes: int) -> list:
        file_order = list(self.candidates)
        if nbytes <= SMALL_BYTES:
            return sorted(file_order, key=lambda fn: (fn.ir.sync_ops, len(fn.ir.body), bool(fn.ir.scratch)))
        return sorted(file_order, key=lambda fn: bool(fn.ir.scratch))

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, **kw) -> None:
        if not isinstance(x, torch.Tensor) or (out is not None and not isinstance(out, torch.Tensor)):
            raise StrataUsageError(f"{self.name}: x (and out, if given) must be torch.Tensors on the heap")
        nbytes = max(x.numel() * x.element_size(), out.numel() * out.element_size() if out is not None else 0)
        ck = (id(self.table), self.module.comm.world, nbytes, out is None)
        hit = self._chosen.get(ck)
        if hit is None or hit[0] is not self.table:   # the table object too: an id may be reused
            if len(self._chosen) >= 256:
                self._chosen.clear()
            hit = self._chosen[ck] = (self.table, *self.choose(nbytes, out is None))
        _, fn, adapt = hit
        self.last = fn.name
        if not adapt:
            fn(x, **kw) if out is None else fn(x, out, **kw)
        elif out is not None:          # out of place through an in-place schedule
            out.copy_(x)
            fn(out, **kw)
        else:                          # in place through an out-of-place schedule
            key = (tuple(x.shape), x.dtype)
            tmp = self._buffers.get(key)
            if tmp is None:            # collective, like every allocation: same calls on every rank
                tmp = self._buffers[key] = self.module.comm.empty(*x.shape, dtype=x.dtype)
            fn(x, tmp, **kw)
            x.copy_(tmp)

    @property
    def last_cores(self):
        fn = next((f for f in self.candidates if f.name == self.last), None)
        return fn.last_cores if fn else None

    def release(self) -> None:
        """Frees the buffers kept for in-place calls through an out-of-place schedule. Collective."""
        for t in reversed(list(self._buffers.values())):
            self.module.comm.free(t)
        self._buffers.clear()
        for fn in self.candidates:
            fn.release_scratch()
