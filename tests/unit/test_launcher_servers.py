"""What the launcher would run, checked without running it: command lines, environments,
port layout, and the refusal to start on a busy port."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig, LaunchError, engine_stop, servers
from tracedpush.launcher.processes import ManagedProcess


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(
    ("mode", "connector"), [("push", "NixlPushConnector"), ("pull", "NixlConnector")]
)
def test_engine_command_lines(model: Path, tmp_path: Path, mode: str, connector: str):
    d = Deployment(
        DeploymentConfig(mode=mode, model=model, run_dir=tmp_path / "run", trace=False),
        log=None,
        lock=False,
    )
    p, dec = d.prefills[0], d.decodes[0]
    for spec, role, engine_id in (
        (p, "kv_producer", "prefill-engine-001"),
        (dec, "kv_consumer", "decode-engine-001"),
    ):
        traced = servers.engine_argv(mode, spec, model, "tiny", 4096, True, tmp_path / "tr")
        kv = json.loads(_arg(traced, "--kv-transfer-config"))
        assert kv["kv_connector"] == connector
        assert kv["kv_connector_module_path"] == "tracedpush.connector"
        assert kv["kv_role"] == role and kv["engine_id"] == engine_id
        assert kv["kv_buffer_device"] == "cpu"
        assert kv["kv_connector_extra_config"]["backends"] == ["UCX"]
        assert kv["kv_connector_extra_config"]["tracedpush"] == {
            "service_name": f"vllm-{spec.role}",
            "traces_dir": str(tmp_path / "tr"),
        }
        assert "--enforce-eager" in traced and "--no-enable-prefix-caching" in traced
        assert traced[1:3] == ["-m", "tracedpush.launcher.vllm_entry"]

        plain = servers.engine_argv(mode, spec, model, "tiny", 4096, False, None)
        kv = json.loads(_arg(plain, "--kv-transfer-config"))
        assert "kv_connector_module_path" not in kv
        assert "tracedpush" not in kv["kv_connector_extra_config"]


def test_engines_get_own_core_side_channel_and_ports(model: Path, tmp_path: Path):
    d = Deployment(
        DeploymentConfig(mode="push", model=model, run_dir=tmp_path, trace=False),
        log=None,
        lock=False,
    )
    envs = [servers.engine_env(e, {}) for e in d.engines]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0", "1"]
    assert [e["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in envs] == ["5600", "5700"]
    assert all(e["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1" for e in envs)
    assert all(e["HF_HUB_OFFLINE"] == "1" and e["VLLM_CPU_KVCACHE_SPACE"] == "1" for e in envs)
    assert (d.prefill_url, d.decode_url, d.proxy_url) == (
        "http://127.0.0.1:8100",
        "http://127.0.0.1:8200",
        "http://127.0.0.1:8000",
    )
    assert set(d.ports()) == {8000, 8100, 8200, 5600, 5700}
    assert set(d.logs) == {"prefill", "decode", "proxy"}


def test_xpyd_layout(model: Path, tmp_path: Path):
    d = Deployment(
        DeploymentConfig(
            mode="pull", model=model, run_dir=tmp_path, trace=False, num_prefill=2, num_decode=2
        ),
        log=None,
        lock=False,
    )
    assert [e.engine_id for e in d.engines] == [
        "prefill-engine-001",
        "prefill-engine-002",
        "decode-engine-001",
        "decode-engine-002",
    ]
    assert d.prefill_urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert [e.side_channel_port for e in d.decodes] == [5700, 5701]
    assert len(set(d.ports())) == 9


def test_proxy_gets_prefill_coordinates(model: Path, tmp_path: Path):
    d = Deployment(
        DeploymentConfig(mode="push", model=model, run_dir=tmp_path, trace=False),
        log=None,
        lock=False,
    )
    argv = servers.proxy_argv(
        "push",
        d.prefills,
        d.decodes,
        "127.0.0.1",
        8000,
        None,
        flags={"--host", "--no-trace-context", "--no-trace-files"},
    )
    assert _arg(argv, "--prefill") == (
        "http://127.0.0.1:8100#engine_id=prefill-engine-001,host=127.0.0.1,port=5600,tp=1,pp=1"
    )
    assert _arg(argv, "--decode") == "http://127.0.0.1:8200#engine_id=decode-engine-001"
    assert "--no-trace-context" in argv and "--no-trace-files" in argv
    assert _arg(argv, "--mode") == "push" and _arg(argv, "--host") == "127.0.0.1"
    # With the real proxy's parser: every flag we pass exists.
    real = servers.proxy_argv("pull", d.prefills, d.decodes, "127.0.0.1", 8000, tmp_path)
    flags = servers.proxy_flags()
    assert all(a in flags for a in real if a.startswith("--"))
    assert _arg(real, "--traces") == str(tmp_path)


def test_refuses_to_start_on_a_busy_port(model: Path, tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        d = Deployment(
            DeploymentConfig(
                mode="push", model=model, run_dir=tmp_path, trace=False, decode_port=busy
            ),
            log=None,
            lock=False,
        )
        with pytest.raises(LaunchError, match=f"port already in use: {busy} \\(decode HTTP\\)"):
            d.start()
    assert d.processes == [] and d.teardown is not None and d.teardown.clean


def test_max_model_len_capped_by_model(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert servers.model_max_len(tmp_path, 4096) == 2048
    assert servers.model_max_len(tmp_path / "nowhere", 4096) == 4096


@pytest.mark.parametrize(
    ("extra", "args", "env", "prefill", "decode"),
    [
        ({}, (), {}, 35 + 17, 10 + 17),  # vLLM's 30 s lease and 5 s; then the teardown
        ({"kv_lease_duration": 3}, (), {}, 27, 27),  # never under engine_drain_timeout
        ({"kv_lease_duration": 60}, (), {}, 82, 27),
        ({}, (), {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "20"}, 67, 42),  # vLLM's grace
        ({}, (), {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "soon"}, 52, 27),  # vLLM says so
        ({}, ("--shutdown-timeout=7",), {}, 7, 7),  # the engines' own wins, for both roles
        ({}, ("--shutdown_timeout", "0"), {}, 0, 0),  # vLLM's parser takes underscores
        ({}, ("--shutdown-timeout", "soon"), {}, 52, 27),  # not a number: vLLM will say so
    ],
)
def test_an_engine_drains_then_tears_down_within_its_shutdown_timeout(
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: dict,
    args: tuple[str, ...],
    env: dict[str, str],
    prefill: int,
    decode: int,
):
    """vLLM's --shutdown-timeout is EngineCore's whole stop: its drain (a prefill
    engine's waits for blocks a decode engine may still claim until their lease ends),
    then its workers' exit (vLLM's grace, SIGTERM, 4 s) and its own. Cut short, it is a
    kill that loses the scheduler's last spans and final export record."""
    monkeypatch.delenv(engine_stop.WORKER_GRACE_ENV, raising=False)
    config = DeploymentConfig(
        mode="push",
        model=model,
        run_dir=tmp_path,
        kv_extra_config=extra,
        engine_args=args,
        env=env,
    )
    assert (config.shutdown_timeout_for("prefill"), config.shutdown_timeout_for("decode")) == (
        prefill,
        decode,
    )


def test_engines_drain_and_stop_after_the_proxy_prefill_first(model: Path, tmp_path: Path):
    """vLLM's default --shutdown-timeout 0 kills EngineCore and workers at once, before
    the connectors flush their last spans: engines get one (theirs wins), are signalled
    alone, and stop after the proxy, prefill before decode, before the collector."""
    d = Deployment(
        DeploymentConfig(
            mode="push",
            model=model,
            run_dir=tmp_path,
            num_prefill=2,
            collect=True,
            decode_args=("--shutdown-timeout", "3"),
        ),
        log=None,
        lock=False,
    )
    procs = {e.name: d.engine_process(e)[0] for e in d.engines}
    assert all(p.stops_own_tree for p in procs.values())
    # a prefill engine drains through vLLM's 30 s KV lease, then tears down (17 s)
    assert _arg(procs["prefill"].argv, "--shutdown-timeout") == "52"
    assert procs["prefill"].stop_grace == 57 and "lease" in procs["prefill"].slow_stop
    decode = procs["decode"].argv
    flags = [i for i, a in enumerate(decode) if a == "--shutdown-timeout"]
    assert [decode[i + 1] for i in flags] == ["3", "3"]  # theirs, and argparse's last wins
    assert procs["decode"].stop_grace == 15  # the stop's own grace
    proxy, collect = d.proxy_process()[0], d.collect_process()[0]
    assert not proxy.stops_own_tree and not collect.stops_own_tree
    d.processes = [collect, *procs.values(), proxy]  # the order they start in
    assert [[p.name for p in stage] for stage in d._stop_order()] == [
        ["proxy"],
        ["prefill", "prefill-1"],
        ["decode"],
        [collect.name],
    ]


@pytest.mark.parametrize(
    ("args", "env", "keys"),
    [
        ((), {}, []),
        ((), {"VLLM_API_KEY": "e"}, ["e"]),
        (("--api-key", "a"), {"VLLM_API_KEY": "e"}, ["a"]),  # the flag wins, as in vLLM
        (("--api-key", "a", "b", "--port", "1"), {}, ["a", "b"]),  # it takes one or more
        (("--api_key=a",), {}, ["a"]),
        (("--api-key", "a", "--api-key", "b"), {}, ["b"]),  # the last flag wins
        (("--api-key", ""), {"VLLM_API_KEY": ""}, []),  # empty keys are no keys
    ],
)
def test_the_api_keys_an_engine_accepts(args: tuple[str, ...], env: dict, keys: list[str]):
    assert servers.api_keys(args, env) == keys


_TWO_KEYS = ("--api-key", "a", "--api-key", "b", "c")


@pytest.mark.parametrize(
    ("args", "env", "argv", "key"),
    [
        (("--port", "1"), {"VLLM_API_KEY": "e"}, ["--port", "1"], "e"),  # no flag: as it was
        (("--api-key", "a", "--port", "1"), {}, ["--port", "1"], "a"),
        (("--api_key=a", "--port", "1"), {"VLLM_API_KEY": "e"}, ["--port", "1"], "a"),
        (("--api-key", "a", "b", "--api-key", "c"), {}, [], "c"),  # the last flag's wins
        (("--api-key=", "--port", "1"), {"VLLM_API_KEY": "e"}, ["--port", "1"], ""),  # none
        # several keys, or none given: vLLM's to take or refuse, on the command line
        (_TWO_KEYS, {}, [*_TWO_KEYS], None),
        (("--api-key", "--port", "1"), {}, ["--api-key", "--port", "1"], None),
    ],
)  # fmt: skip
def test_one_api_key_moves_from_the_command_line_to_the_environment(
    args: tuple[str, ...], env: dict, argv: list[str], key: str | None
):
    """The key vLLM would take, where only the engine's own user can read it: what the
    engine accepts (`api_keys`, as vLLM decides) is the same either way."""
    moved_argv, moved_env = servers.key_in_env(args, env)
    assert moved_argv == argv
    assert moved_env.get("VLLM_API_KEY") == (env.get("VLLM_API_KEY") if key is None else key)
    assert servers.api_keys(moved_argv, moved_env) == servers.api_keys(args, env)


def test_secret_flag_values_are_redacted_for_logs():
    argv = ["vllm", "--api-key", "a", "b", "--port", "1", "--hf_token=t", "--model", "m"]
    assert servers.redacted(argv) == [
        "vllm", "--api-key", "***", "***", "--port", "1", "--hf_token=***", "--model", "m"
    ]  # fmt: skip


def test_the_proxy_gets_a_key_both_roles_accept(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Engines given --api-key in their arguments refuse the proxy's own calls (the model
    catalog, the coordinate probe) without it: the proxy gets one every engine accepts,
    in its environment, never in a command line or a log."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def proxy(**args: object) -> Deployment:
        config = DeploymentConfig(mode="push", model=model, run_dir=tmp_path, **args)  # type: ignore[arg-type]
        return Deployment(config, log=None, lock=False)

    d = proxy(prefill_args=("--api-key", "p", "both"), decode_args=("--api-key", "both", "d"))
    proc, env = d.proxy_process()
    assert env["VLLM_API_KEY"] == "both" and "both" not in proc.argv
    # an engine's one key goes in its environment too; several stay (the variable holds one)
    one = proxy(prefill_args=("--api-key", "p"), decode_args=("--api-key", "p", "d"))
    (p, p_env), (dec, d_env) = (one.engine_process(e) for e in one.engines)
    assert "p" not in p.argv and "--api-key" not in p.argv and p_env["VLLM_API_KEY"] == "p"
    assert dec.argv[-3:] == ["--api-key", "p", "d"] and "VLLM_API_KEY" not in d_env
    assert proxy(engine_args=("--api-key=k",)).proxy_process()[1]["VLLM_API_KEY"] == "k"
    assert "VLLM_API_KEY" not in proxy().proxy_process()[1]
    # one role needs none: the other's key (D ignores a key it does not need)
    assert proxy(decode_args=("--api-key", "d")).proxy_process()[1]["VLLM_API_KEY"] == "d"
    env_key = proxy(env={"VLLM_API_KEY": "e"}, decode_args=("--api-key", "d", "e"))
    assert env_key.proxy_process()[1]["VLLM_API_KEY"] == "e"
    with pytest.raises(ValueError, match="no API key in common") as err:
        proxy(prefill_args=("--api-key", "p"), decode_args=("--api-key", "d"))
    assert "'p'" not in str(err.value) and "'d'" not in str(err.value)  # no secret shown
    # a process's log begins with its command line, secrets redacted
    proc = ManagedProcess(
        "x", [sys.executable, "-c", "pass", "--api-key", "s1", "s2"], tmp_path / "x.log"
    )
    proc.start(os.environ, cwd=tmp_path)
    proc.popen.wait(timeout=30)  # type: ignore[union-attr]
    head = proc.log_path.read_text().splitlines()[0]
    assert head.endswith("-c pass --api-key *** ***"), head
