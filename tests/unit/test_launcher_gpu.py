"""`tracedpush up` on a GPU box, checked without one: what each engine would run.

Per-role vLLM arguments (tensor parallelism, memory), P's parallel sizes in the proxy's
coordinates, kv_buffer_device, CUDA_VISIBLE_DEVICES per engine, and no CPU pinning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig, servers


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "real-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    return d


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _gpu_deployment(model: Path, tmp_path: Path, **kw: object) -> Deployment:
    fields: dict[str, object] = {
        "engine_args": ("--gpu-memory-utilization=0.85", "--no-enforce-eager"),
        "prefill_args": ("--tensor-parallel-size", "2"),
        "decode_args": ("-tp=1", "--max-num-seqs=64"),
        "prefill_gpus": ("0,1",),
        "decode_gpus": ("2",),
        **kw,
    }
    config = DeploymentConfig(
        mode="push", model=model, run_dir=tmp_path / "run", platform="cuda", **fields
    )  # type: ignore[arg-type]
    return Deployment(config, log=None, lock=False)


def test_gpu_engines_get_their_args_devices_and_no_pinning(model: Path, tmp_path: Path):
    d = _gpu_deployment(model, tmp_path)
    (p, p_env), (dec, d_env) = (d.engine_process(e) for e in d.engines)
    assert p.argv[-4:] == [
        "--gpu-memory-utilization=0.85",
        "--no-enforce-eager",  # after the launcher's --enforce-eager: vLLM takes the last
        "--tensor-parallel-size",
        "2",
    ]
    assert dec.argv[-4:] == [
        "--gpu-memory-utilization=0.85",
        "--no-enforce-eager",
        "-tp=1",
        "--max-num-seqs=64",
    ]
    assert "--tensor-parallel-size" not in dec.argv
    for proc in (p, dec):
        assert json.loads(_arg(proc.argv, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
        assert proc.cpus == ()  # a GPU engine's tree is not pinned to one core
    assert (p_env["CUDA_VISIBLE_DEVICES"], d_env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2")
    for env in (p_env, d_env):
        assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert p_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"


def test_proxy_is_told_ps_tensor_parallel_size(model: Path, tmp_path: Path):
    """D must expect P's TP: the coordinates the proxy sends D carry tp=2."""
    d = _gpu_deployment(model, tmp_path)
    proxy, _ = d.proxy_process()
    assert _arg(proxy.argv, "--prefill").endswith(
        "#engine_id=prefill-engine-001,host=127.0.0.1,port=5600,tp=2,pp=1"
    )


def test_kv_buffer_device_can_be_chosen(model: Path, tmp_path: Path):
    """cpu on a GPU box is vLLM's host-buffer path; it is the user's choice."""
    d = _gpu_deployment(model, tmp_path, kv_buffer_device="cpu")
    p, _ = d.engine_process(d.prefills[0])
    assert json.loads(_arg(p.argv, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"


def test_cpu_platform_keeps_one_core_per_engine(model: Path, tmp_path: Path):
    d = Deployment(
        DeploymentConfig(mode="pull", model=model, run_dir=tmp_path, platform="cpu"),
        log=None,
        lock=False,
    )
    p, p_env = d.engine_process(d.prefills[0])
    assert p_env["VLLM_CPU_OMP_THREADS_BIND"] == "0" and p.cpus == (0,)
    assert "CUDA_VISIBLE_DEVICES" not in p_env or p_env["CUDA_VISIBLE_DEVICES"] == ""
    assert json.loads(_arg(p.argv, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"


def test_platform_is_read_from_the_installed_vllm():
    """This machine runs vllm-cpu (the vLLM 0.33 overlay adds vllm too: cpu still wins)."""
    assert servers.vllm_platform() == "cpu"


@pytest.mark.parametrize(
    ("args", "sizes"),
    [
        ((), (1, 1)),
        (("--tensor-parallel-size", "4"), (4, 1)),
        (("--tensor-parallel-size=8", "--pipeline-parallel-size=2"), (8, 2)),
        (("-tp", "2", "-pp=3"), (2, 3)),
        (("--tensor_parallel_size=2",), (2, 1)),
        (("-tp=2", "--tensor-parallel-size", "4"), (4, 1)),  # the last one wins
        (("--max-num-seqs", "64"), (1, 1)),
    ],
)
def test_parallel_sizes(args: tuple[str, ...], sizes: tuple[int, int]):
    assert servers.parallel_sizes(args) == sizes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tensor-parallel-size",), "needs a value"),
        (("-tp=two",), "expected an integer >= 1, got 'two'"),
        (("--pipeline-parallel-size", "0"), "expected an integer >= 1, got '0'"),
    ],
)
def test_bad_parallel_sizes_are_refused(args: tuple[str, ...], message: str):
    with pytest.raises(ValueError, match=message):
        servers.parallel_sizes(args)


def test_gpu_list_per_engine_is_checked(model: Path, tmp_path: Path):
    with pytest.raises(ValueError, match="2 --decode-gpus for 1 decode engine"):
        _gpu_deployment(model, tmp_path, decode_gpus=("2", "3"))


def test_up_reports_bad_engine_arguments_before_starting(model: Path, tmp_path: Path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracedpush",
            "up",
            "--model",
            str(model),
            "--run-dir",
            str(tmp_path / "run"),
            "--prefill-arg=--tensor-parallel-size=zero",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "tracedpush up: vLLM argument --tensor-parallel-size: expected an integer" in (
        done.stderr
    )


def test_up_help_documents_the_passthrough():
    out = subprocess.run(
        [sys.executable, "-m", "tracedpush", "up", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in ("--engine-arg", "--prefill-arg", "--decode-arg", "--kv-buffer-device"):
        assert flag in out
    assert "--prefill-gpus" in out and "CUDA_VISIBLE_DEVICES" in out


def test_up_flags_reach_the_deployment_config():
    import argparse

    from tracedpush.launcher.command import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--kv-buffer-device=cuda",
            "--engine-arg=--gpu-memory-utilization=0.4",
            "--prefill-arg=-tp=2",
            "--decode-arg=--max-num-seqs=8",
            "--prefill-gpus=0,1",
            "--decode-gpus=2",
        ]
    )
    c = config_from_args(args)
    assert c.kv_buffer_device == "cuda"
    assert c.engine_args == ("--gpu-memory-utilization=0.4",)
    assert (c.prefill_args, c.decode_args) == (("-tp=2",), ("--max-num-seqs=8",))
    assert (c.prefill_gpus, c.decode_gpus) == (("0,1",), ("2",))
