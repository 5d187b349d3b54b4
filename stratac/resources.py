"""Where the grammar, templates and runtime sources live, in a checkout and in an installed wheel.

The wheel maps the top-level dsl/, templates/ and runtime/ folders into the package (stratac/dsl,
stratac/templates, stratac/runtime; see pyproject.toml), so an installed stratac needs no checkout.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(kind: str) -> Path:
    """kind is dsl, templates or runtime: top-level folders of a checkout, package data of a wheel."""
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / kind).is_dir():
        return checkout / kind
    return _PACKAGE / kind


def resource_path(kind: str, *parts: str) -> Path:
    return resource_dir(kind).joinpath(*parts)


def tree_digest(*dirs: Path, suffixes: tuple[str, ...] = (".py", ".lark", ".j2", ".h", ".cpp")) -> str:
    """A hash of every source file under dirs (relative path and content), for cache keys."""
    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in suffixes):
            h.update(str(f.relative_to(d)).encode())
            h.update(b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def compiler_digest() -> str:
    """A hash of stratac's own code, grammar, templates and runtime."""
    return tree_digest(_PACKAGE, resource_dir("dsl"), resource_dir("templates"),
                       resource_dir("runtime"))
