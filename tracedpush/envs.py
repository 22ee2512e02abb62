"""Environment variables as command-line defaults, read one way by every command.

Like vLLM's ``envs.py``: a flag's default may come from ``TRACEDPUSH_*`` (shown in
``--help``). One behaviour for all: an unset or empty variable means "not given", and a
value that does not parse stops the command with a message naming the variable, before
anything starts.
"""

from __future__ import annotations

import os
from pathlib import Path

# where `tracedpush report` and the console keep the analysis index of trace files when
# no --index-dir is given: a directory per set of trace paths under this one, instead of
# beside the traces (`analysis.index.default_dir`; as vLLM's VLLM_CACHE_ROOT)
INDEX_ROOT = "TRACEDPUSH_INDEX_ROOT"
# the most the indexes under INDEX_ROOT may take on disk (e.g. 50G): after each build
# there, and each update that grows an index there, the least recently used others go
# until they fit (`analysis.index_cache.keep_under_cap`; as ccache's max_size); unset:
# only `tracedpush index prune` removes any
INDEX_MAX_SIZE = "TRACEDPUSH_INDEX_MAX_SIZE"


def user_cache(*parts: str) -> Path:
    """``$XDG_CACHE_HOME`` (default ~/.cache)/tracedpush/`parts`: the user-level cache
    every checkout on a machine shares (the tiny model, the analysis code's digests)."""
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser().joinpath("tracedpush", *parts)


_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name, "").strip()
    return value if value else default


def env_int(name: str, default: int) -> int:
    value = env_str(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    value = env_str(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not a number") from None


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise SystemExit(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_list(name: str) -> list[str] | None:
    """Whitespace-separated values, or None when unset or empty."""
    value = env_str(name)
    return value.split() if value else None
