"""The engines' temp directory (`tracedpush.launcher.engine_tmp`): made per deployment,
given to every engine as TMPDIR (torch's kernel cache kept in its usual place), removed
at a clean stop, swept once its launcher is gone. Real directories, real socket files,
a real ended process; the e2e lane checks the same with vLLM's own files
(tests/e2e/test_pd_e2e.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig, engine_tmp


@pytest.fixture
def tmp_root(monkeypatch: pytest.MonkeyPatch):
    """The temp directory the module makes its directories in, for this test alone
    (short, as /tmp is: a socket's path must fit in 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="tmp", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root)


def _socket_in(d: Path) -> Path:
    """A bound unix socket file in `d`, as a stopped engine leaves one."""
    path = d / "0b1e4d3c-socket"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    assert path.exists()
    return path


def _ended_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_make_gives_a_fresh_directory_named_for_this_launcher(tmp_root: Path):
    a, b = engine_tmp.make(), engine_tmp.make()
    assert a is not None and b is not None and a != b
    assert a.parent == tmp_root and a.is_dir()
    assert a.name.startswith(f"{engine_tmp.PREFIX}{os.getpid()}-")


def test_a_temp_directory_too_long_for_a_socket_path_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(tempfile, "tempdir", "/" + "x" * 60)  # never made: checked first
    assert engine_tmp.make() is None
    assert engine_tmp.env(None, {}) == {}


def test_sweep_removes_the_directories_of_ended_launchers_only(tmp_root: Path):
    dead = tmp_root / f"{engine_tmp.PREFIX}{_ended_pid()}-abc"
    mine = tmp_root / f"{engine_tmp.PREFIX}{os.getpid()}-def"
    other = tmp_root / f"{engine_tmp.PREFIX}notapid"  # not ours by name: left alone
    for d in (dead, mine, other):
        d.mkdir()
        _socket_in(d)
    assert engine_tmp.sweep() == [dead]
    assert not dead.exists() and mine.is_dir() and other.is_dir()
    dead.mkdir()  # make sweeps first
    got = engine_tmp.make()
    assert not dead.exists() and got is not None and got.is_dir()


def test_the_kernel_cache_stays_where_torch_keeps_it(tmp_root: Path):
    torch_default = pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    assert engine_tmp.inductor_cache() == torch_default.default_cache_dir()
    where = tmp_root / "x"
    got = engine_tmp.env(where, {})
    assert got == {"TMPDIR": str(where), "TORCHINDUCTOR_CACHE_DIR": engine_tmp.inductor_cache()}
    mine = {"TORCHINDUCTOR_CACHE_DIR": "/srv/kernels"}  # the user's own: kept
    assert engine_tmp.env(where, mine)["TORCHINDUCTOR_CACHE_DIR"] == "/srv/kernels"


def test_engines_get_the_directory_and_a_clean_stop_removes_it(
    model: Path, tmp_path: Path, tmp_root: Path
):
    config = DeploymentConfig(mode="push", model=model, run_dir=tmp_path / "run", trace=False)
    d = Deployment(config, log=None, lock=False)
    before = d.engine_process(d.prefills[0])[1]  # not started: the launcher's own TMPDIR
    assert before.get("TMPDIR") == os.environ.get("TMPDIR")
    d.engine_tmp = engine_tmp.make()  # what `_start` does before the engines start
    assert d.engine_tmp is not None
    where = d.engine_tmp
    for e in d.engines:
        assert d.engine_process(e)[1]["TMPDIR"] == str(where)
    assert d.proxy_process()[1].get("TMPDIR") != str(where)  # the engines' alone
    _socket_in(where)
    assert d.stop().clean
    assert not where.exists() and d.engine_tmp is None
    # a TMPDIR the deployment's env sets wins
    config = DeploymentConfig(
        mode="push", model=model, run_dir=tmp_path / "b", trace=False, env={"TMPDIR": "/srv"}
    )
    d = Deployment(config, log=None, lock=False)
    d.engine_tmp = engine_tmp.make()
    assert d.engine_process(d.decodes[0])[1]["TMPDIR"] == "/srv"
    d.stop()
