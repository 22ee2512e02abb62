"""Which analysis code made an index: a digest of what its modules do, not how they read.

An index keeps results only as right as the code that made them, so an index made by
other code is built again (`index.format_key`), which takes a minute at 200,000
requests. A digest of the modules' bytes rebuilt every index after any upgrade, even
one that only reworded a docstring or a comment. This digest is of their syntax trees
with docstrings dropped: comments, blank lines and layout are not in a tree, line
numbers are left out of its dump, and docstrings are removed. Any change to what the
code does (a name, a constant, a statement) still changes it.

Parsing the modules costs about 0.2 s, so the digest is kept in the user's cache under
the digest of their exact bytes (`$XDG_CACHE_HOME/tracedpush/code-digests/`): only the
first process after an upgrade parses them. A cache that cannot be read or written
costs that parse, never a wrong answer: an entry is named by the bytes it was made from.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from tracedpush import envs

_DIGEST = re.compile(r"[0-9a-f]{16}")
KEEP = 32  # cache entries kept (one per version of the sources seen): the newest
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def cache_dir() -> Path:
    """Where digests are kept: ``$XDG_CACHE_HOME`` (default ~/.cache)/tracedpush/code-digests."""
    return envs.user_cache("code-digests")


def digest(files: Sequence[Path], salt: str = "") -> str:
    """16 hex digits for what the Python `files` do (those that exist), with `salt`
    (e.g. the Python version, which `marshal`'s output depends on)."""
    sources = [(f.name, f.read_bytes()) for f in sorted(files) if f.exists()]
    raw = hashlib.sha256(salt.encode())
    for name, src in sources:
        raw.update(name.encode() + b"\0" + src + b"\0")
    entry = cache_dir() / raw.hexdigest()
    try:
        kept = entry.read_text().strip()
        if _DIGEST.fullmatch(kept):
            return kept
    except OSError:
        pass
    got = semantic(sources, salt)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(got + "\n")
        os.replace(tmp, entry)
        _prune(entry.parent)
    except OSError:  # a read-only cache: parsed again next time
        pass
    return got


def _prune(directory: Path) -> None:
    """Keep the `KEEP` newest entries (a checkout under edit makes one per version)."""
    entries = sorted(directory.iterdir(), key=lambda f: f.stat().st_mtime_ns, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)


def semantic(sources: Sequence[tuple[str, bytes]], salt: str = "") -> str:
    """The digest of (file name, source) pairs' syntax trees without their docstrings."""
    h = hashlib.sha256(salt.encode())
    for name, src in sources:
        tree = ast.parse(src, filename=name)
        for node in ast.walk(tree):
            if isinstance(node, _DOCUMENTED) and _docstring(node.body):
                node.body = node.body[1:]
        h.update(name.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return h.hexdigest()[:16]


def _docstring(body: list[ast.stmt]) -> bool:
    first = body[0] if body else None
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
