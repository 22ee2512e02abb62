"""tracedpush.launcher.vllm_entry's NIXL-worker core correction relies on a private vLLM
method (``CpuPlatform.discover_numa_topology``). Present: patched, silently. Absent: one
clear warning per engine (not one per vLLM process), nothing patched."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def entry(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The entry module, imported with nothing to pin (its import-time code is a no-op)."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("TRACEDPUSH_PIN_KV_THREAD", "0")
    module = importlib.import_module("tracedpush.launcher.vllm_entry")
    monkeypatch.delenv(module.KV_THREAD_WARNED_ENV, raising=False)  # restored afterwards
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    return module


def test_missing_method_warns_once_naming_what_is_not_applied(
    entry: types.ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    fake = types.ModuleType("vllm.platforms.cpu")
    fake.CpuPlatform = type("CpuPlatform", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.platforms.cpu", fake)

    assert entry.keep_kv_thread_on_own_core() is False
    err = capsys.readouterr().err
    assert err.count("[tracedpush] WARNING") == 1
    assert "has no discover_numa_topology" in err
    assert "NOT kept on this engine's cores [1]" in err  # what is not applied
    assert "slow down several-fold" in err  # the consequence
    assert "TRACEDPUSH_PIN_KV_THREAD=0" in err  # how to opt out
    assert os.environ[entry.KV_THREAD_WARNED_ENV] == "1"  # inherited by vLLM's children

    assert entry.keep_kv_thread_on_own_core() is False
    assert capsys.readouterr().err == ""  # once
    assert not hasattr(fake.CpuPlatform, "discover_numa_topology")  # nothing patched


def test_unimportable_platform_module_warns(
    entry: types.ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setitem(sys.modules, "vllm.platforms.cpu", None)  # import raises ImportError
    assert entry.keep_kv_thread_on_own_core() is False
    err = capsys.readouterr().err
    assert "vllm.platforms.cpu cannot be imported" in err and "NOT kept" in err


def test_no_cores_no_warning(
    entry: types.ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Nothing to correct (no explicit core list): no patch, no warning."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    monkeypatch.setitem(sys.modules, "vllm.platforms.cpu", None)
    assert entry.keep_kv_thread_on_own_core() is False
    assert capsys.readouterr().err == ""


def test_real_vllm_method_is_patched_without_warning(
    entry: types.ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    cpu = pytest.importorskip("vllm.platforms.cpu")
    original = cpu.CpuPlatform.__dict__["discover_numa_topology"]
    monkeypatch.setattr(cpu.CpuPlatform, "discover_numa_topology", original)  # restored after
    assert entry.keep_kv_thread_on_own_core() is True
    assert cpu.CpuPlatform.discover_numa_topology() == [[1]]
    assert capsys.readouterr().err == ""


# An engine's process tree as vLLM builds it: the server imports the entry module, then a
# spawned child (EngineCore) re-imports the script as __mp_main__, and so the entry too.
ENGINE_TREE = textwrap.dedent(
    """
    import multiprocessing as mp
    import tracedpush.launcher.vllm_entry  # noqa: F401

    def engine_core():
        pass

    if __name__ == "__main__":
        child = mp.get_context("spawn").Process(target=engine_core)
        child.start()
        child.join(60)
        print("child exit", child.exitcode, flush=True)
    """
)


def test_one_warning_per_engine_process_tree(tmp_path: Path):
    """A vLLM without the method (a stand-in package first on the path): the server and its
    spawned child both run the check, the engine log gets the warning once."""
    stand_in = tmp_path / "site" / "vllm" / "platforms"
    stand_in.mkdir(parents=True)
    (stand_in.parent / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (stand_in / "__init__.py").write_text("")
    (stand_in / "cpu.py").write_text("class CpuPlatform:\n    pass\n")
    script = tmp_path / "server.py"
    script.write_text(ENGINE_TREE)
    env = {k: v for k, v in os.environ.items() if k != "TRACEDPUSH_KV_THREAD_WARNED"} | {
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(PROJECT_ROOT)]),
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "TRACEDPUSH_PIN_ENGINE_TREE": "0",  # this test is about the warning only
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "child exit 0" in done.stdout
    assert done.stderr.count("[tracedpush] WARNING") == 1, done.stderr
    assert "(vLLM 9.9.9)" in done.stderr
