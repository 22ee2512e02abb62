"""The engines' temp directory: one per deployment, removed when it stops.

A vLLM engine stopped by a signal leaves files in the temp directory at every start:
its ZMQ sockets (named by a fresh UUID in ``VLLM_RPC_BASE_PATH``, by default the temp
directory) and torch.distributed's file store (``vllm_dist_<uuid>``). On this machine a
day of runs and tests left about 2,000 sockets and 300 stores in /tmp. So a deployment
gives its engines ``TMPDIR=<temp>/tracedpush-engines-<launcher pid>-<random>`` and removes
that directory when it stops with no process left; one whose launcher died without
stopping (SIGKILL) is removed by the next deployment that starts on the host.

What the temp directory held across runs stays where it was: torch's compiled-kernel
cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the temp directory) is pinned to
its usual place, so engines do not compile again each run. A ``VLLM_RPC_BASE_PATH`` or
``TMPDIR`` the deployment's ``env`` sets wins. A socket's path must fit in 107 bytes: if
the temp directory's path leaves no room for ours and vLLM's names, nothing changes.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
from pathlib import Path

from tracedpush import pids

PREFIX = "tracedpush-engines-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")
# a socket's path: the directory, "/", a UUID (36); sun_path holds 107 bytes and a NUL
_SOCKET_PATH_MAX = 107
_NAMES = len(PREFIX) + 7 + 1 + 8 + 1 + 36  # our name (pid, mkdtemp's 8), "/", vLLM's


def make() -> Path | None:
    """A fresh directory (None when the temp directory's path is too long for it),
    after sweeping the ones of launchers no longer alive."""
    if len(tempfile.gettempdir()) + 1 + _NAMES > _SOCKET_PATH_MAX:
        return None
    sweep()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def env(path: Path | None, base: dict[str, str]) -> dict[str, str]:
    """What an engine's environment `base` gets for temp directory `path`."""
    if path is None:
        return {}
    return {
        "TMPDIR": str(path),
        "TORCHINDUCTOR_CACHE_DIR": base.get("TORCHINDUCTOR_CACHE_DIR") or inductor_cache(),
    }


def inductor_cache() -> str:
    """torch's default compiled-kernel cache (`cache_dir_utils.default_cache_dir`),
    computed here without importing torch."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )


def remove(path: Path) -> None:
    """The directory and whatever the engines left in it."""
    shutil.rmtree(path, ignore_errors=True)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove this user's engine temp directories whose launcher has ended."""
    root = Path(root or tempfile.gettempdir())
    gone: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return gone
    uid = os.getuid()
    for e in entries:
        m = _NAME.match(e.name)
        if m is None or not e.is_dir(follow_symlinks=False):
            continue
        try:
            if e.stat(follow_symlinks=False).st_uid != uid or pids.alive(int(m.group(1))):
                continue
        except OSError:
            continue
        remove(Path(e.path))
        gone.append(Path(e.path))
    return gone
