"""Where the grammar, templates and runtime sources live, in a checkout and in an installed wheel.

The wheel maps the top-level dsl/, templates/ and runtime/ folders to the packages stratac.dsl,
stratac.templates and stratac.runtime, so importlib.resources finds them in both cases.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path

_PACKAGES = {"dsl": "stratac.dsl", "templates": "stratac.templates", "runtime": "stratac.runtime"}


def resource_dir(kind: str) -> Path:
    checkout = Path(__file__).resolve().parent.parent / kind
    if (checkout / ".").is_dir() and (Path(__file__).resolve().parent.parent / "pyproject.toml").exists():
        return checkout
    return Path(str(importlib.resources.files(_PACKAGES[kind])))


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


def compiler_digest() -> str:
    """A hash of stratac's own code, grammar, templates and runtime."""
    return tree_digest(Path(__file__).resolve().parent, resource_dir("dsl"), resource_dir("templates"),
                       resource_dir("runtime"))
