"""Command lines and environments of the processes in a local P/D deployment.

Pure functions, no side effects: what `tracedpush up` runs is inspectable (and unit
tested) without starting anything. The settings are the ones verified on 2-core CPU
machines (docs/launcher.md explains each).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tracedpush import semconv

Mode = Literal["push", "pull"]
Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")

# vLLM's own connector class names; ours in tracedpush.connector carry the same names.
CONNECTOR_CLASS: dict[str, str] = {"push": "NixlPushConnector", "pull": "NixlConnector"}
TRACED_CONNECTOR_MODULE = "tracedpush.connector"
KV_ROLE: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
SERVICE_NAME: dict[str, str] = {
    "prefill": semconv.SERVICE_PREFILL,
    "decode": semconv.SERVICE_DECODE,
}
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENGINE_ENTRY = "tracedpush.launcher.vllm_entry"


@dataclass(frozen=True)
class EngineSpec:
    """One vLLM engine: where it listens and which core it owns."""

    role: Role
    index: int  # 0-based within its role
    host: str
    port: int  # OpenAI HTTP port
    side_channel_port: int  # NIXL handshake (ZMQ) port
    cpus: str  # VLLM_CPU_OMP_THREADS_BIND value, e.g. "0"; also the whole tree's affinity
    generation: int = 0  # restarts under a new engine id (see Deployment.respawn)
    tp_size: int = 1  # its vLLM --tensor-parallel-size (P's goes to D in push mode)
    pp_size: int = 1  # its vLLM --pipeline-parallel-size
    gpus: str = ""  # CUDA_VISIBLE_DEVICES of a GPU engine, e.g. "0,1"; "" = inherit

    @property
    def name(self) -> str:
        return self.role if self.index == 0 else f"{self.role}-{self.index}"

    @property
    def engine_id(self) -> str:
        base = f"{self.role}-engine-{self.index + 1:03d}"
        return f"{base}-r{self.generation}" if self.generation else base

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def coordinates(self) -> dict[str, Any]:
        """P's NIXL coordinates, as a push-mode decode request needs them."""
        return {
            "engine_id": self.engine_id,
            "host": self.host,
            "port": self.side_channel_port,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
        }


def kv_transfer_config(
    mode: Mode,
    spec: EngineSpec,
    trace: bool,
    traces_dir: Path | None,
    extra_config: dict[str, Any] | None = None,
    kv_buffer_device: str = "cpu",
) -> dict[str, Any]:
    """The --kv-transfer-config of one engine (traced connectors unless trace=False).

    ``extra_config`` is merged into ``kv_connector_extra_config`` (e.g. vLLM's
    ``num_threads`` or ``kv_lease_duration``). ``kv_buffer_device``: "cpu" on vllm-cpu,
    "cuda" (KV registered in GPU memory) on a GPU box.
    """
    extra: dict[str, Any] = {"backends": ["UCX"], **(extra_config or {})}
    config: dict[str, Any] = {
        "kv_connector": CONNECTOR_CLASS[mode],
        "kv_buffer_device": kv_buffer_device,
        "kv_role": KV_ROLE[spec.role],
        "engine_id": spec.engine_id,
        "kv_connector_extra_config": extra,
    }
    if trace:
        config["kv_connector_module_path"] = TRACED_CONNECTOR_MODULE
        settings: dict[str, Any] = {"service_name": SERVICE_NAME[spec.role]}
        if traces_dir is not None:
            settings["traces_dir"] = str(traces_dir)
        extra["tracedpush"] = settings
    return config


RECEIPT_MIDDLEWARE = "tracedpush.connector.http.ReceiptMiddleware"
SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"  # a stopping engine's drain and teardown (engine_stop)


def engine_argv(
    mode: Mode,
    spec: EngineSpec,
    model: Path,
    served_model_name: str,
    max_model_len: int,
    trace: bool,
    traces_dir: Path | None,
    extra_args: tuple[str, ...] = (),
    python: str = sys.executable,
    kv_extra_config: dict[str, Any] | None = None,
    kv_buffer_device: str = "cpu",
    shutdown_timeout: int | None = None,
) -> list[str]:
    # `python -m` because the `vllm` console script fails under the vllm-cpu distribution;
    # vllm_entry is vLLM's api_server keeping the NIXL worker on the engine's own core.
    return [
        python,
        "-m",
        ENGINE_ENTRY,
        "--model",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",  # ~45 s startup instead of ~105 s of torch.compile warm-up
        "--no-enable-prefix-caching",  # a cache hit on D would hide a missing transfer
        "--kv-transfer-config",
        json.dumps(
            kv_transfer_config(mode, spec, trace, traces_dir, kv_extra_config, kv_buffer_device),
            separators=(",", ":"),
        ),
        # the moment each engine's HTTP server had a request (`http_received` on spans)
        *(("--middleware", RECEIPT_MIDDLEWARE) if trace else ()),
        # a stop then drains and tears down in order (launcher.deployment); the engine's
        # own arguments come after, so one of theirs wins
        *((SHUTDOWN_TIMEOUT_FLAG, str(shutdown_timeout)) if shutdown_timeout else ()),
        *extra_args,
    ]


def _with_pythonpath(env: dict[str, str]) -> None:
    # Engines must import tracedpush.connector even when tracedpush is not pip-installed.
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PROJECT_ROOT) not in parts:
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *parts])


def common_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    _with_pythonpath(env)
    return env


def engine_env(
    spec: EngineSpec, base: dict[str, str] | None = None, platform: str = "cpu"
) -> dict[str, str]:
    """An engine's environment. CPU: its cores and KV cache size; GPU: its devices."""
    env = common_env(base)
    env.update(
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": spec.host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.side_channel_port),
        }
    )
    if platform == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpus
        env["VLLM_CPU_KVCACHE_SPACE"] = env.get("TRACEDPUSH_KVCACHE_GIB", "1")
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = spec.gpus
    return env


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: ``vllm-cpu`` (the CPU build) or
    ``vllm``; None without one. Read from package metadata: vLLM is not imported."""
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_platform() -> str:
    """`"cpu"` when the installed vLLM is the CPU build or there is none, else `"cuda"`."""
    found = installed_vllm()
    return "cuda" if found is not None and found[0] == "vllm" else "cpu"


_PARALLEL_FLAGS = {
    "--tensor-parallel-size": 0,
    "-tp": 0,
    "--pipeline-parallel-size": 1,
    "-pp": 1,
}


def vllm_flags(args: Sequence[str]) -> Iterator[tuple[str, str | None, str]]:
    """``(flag, value, argument)`` for each of an engine's extra vLLM arguments, read as
    vLLM's parser reads them: ``--flag N`` or ``--flag=N``, underscores in a long flag's
    name as dashes. ``value`` is None for a flag that ends the list. Every argument is
    yielded (a value too, as a flag nobody asks for); the last of a flag wins in vLLM."""
    args = list(args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.startswith("--"):
            flag = flag.replace("_", "-")
        yield flag, (value if eq else args[i + 1] if i + 1 < len(args) else None), arg


API_KEY_FLAG = "--api-key"  # vLLM's: one or more keys, the last flag's win
API_KEY_ENV = "VLLM_API_KEY"  # what vLLM's server reads when no --api-key is given
# flags whose values vLLM's own logs redact (`redact_sensitive_args`): ours do too
SECRET_FLAGS = frozenset({API_KEY_FLAG, "--hf-token"})


def api_keys(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The API keys an engine started with these extra vLLM arguments and this
    environment accepts, as vLLM's server decides: the last ``--api-key``'s values (it
    takes one or more: ``--api-key A B``, ``--api-key=A``), else `API_KEY_ENV`; empty
    ones dropped. [] when the engine needs no key."""
    args = list(args)
    keys: list[str] | None = None
    for i, (flag, value, arg) in enumerate(vllm_flags(args)):
        if flag == API_KEY_FLAG:
            keys = [value or ""] if "=" in arg else _values(args, i)
    if keys is None:
        keys = [env.get(API_KEY_ENV, "")]
    return [k for k in keys if k]


def key_in_env(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """An engine's ``--api-key`` moved off its command line, which every user of the host
    can read (``/proc/PID/cmdline``, ``ps``), into its environment (`API_KEY_ENV`, which
    only its own user can read), where vLLM's server reads it too. The key vLLM would
    take is the one moved: the last ``--api-key``'s, which wins over the variable, so
    every ``--api-key`` goes. Several keys (``--api-key A B``) stay where they are: the
    variable holds one. A flag without a value stays too, for vLLM to refuse."""
    args, env = list(argv), dict(env)
    flags = [(i, arg) for i, (flag, _, arg) in enumerate(vllm_flags(args)) if flag == API_KEY_FLAG]
    if not flags:
        return args, env
    places = [(i, 1 if "=" in arg else 1 + len(_values(args, i))) for i, arg in flags]
    i, n = places[-1]
    last = [args[i].partition("=")[2]] if "=" in args[i] else args[i + 1 : i + n]
    if len(last) != 1:
        return args, env
    drop = {j for i, n in places for j in range(i, i + n)}
    env[API_KEY_ENV] = last[0]
    return [a for j, a in enumerate(args) if j not in drop], env


def _values(args: list[str], i: int) -> list[str]:
    """The values after the flag at `i` for a flag that takes one or more (``nargs="+"``,
    as ``--api-key``): every argument up to the next flag."""
    return list(itertools.takewhile(lambda a: not a.startswith("-"), args[i + 1 :]))


def redacted(argv: Sequence[str]) -> list[str]:
    """`argv` with the values of `SECRET_FLAGS` as ``***``, for logs (vLLM's own logs
    redact them too). The process itself gets the real argv."""
    args, out = list(argv), list(argv)
    for i, (flag, _, arg) in enumerate(vllm_flags(args)):
        if flag not in SECRET_FLAGS:
            continue
        name, eq, _ = arg.partition("=")
        if eq:
            out[i] = f"{name}=***"
            continue
        for j in range(i + 1, i + 1 + len(_values(args, i))):
            out[j] = "***"
    return out


def parallel_sizes(args: Sequence[str]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes an engine's extra vLLM arguments ask for.

    Recognises vLLM's spellings: ``--tensor-parallel-size N``, ``--tensor-parallel-size=N``,
    ``-tp N``, ``-tp=N`` (underscores too), and the same for pipeline parallelism; the
    last one wins, as in vLLM's parser. ValueError for a value that is not an integer >= 1.
    """
    sizes = [1, 1]
    for flag, value, arg in vllm_flags(args):
        which = _PARALLEL_FLAGS.get(flag)
        if which is None:
            continue
        if value is None:
            raise ValueError(f"vLLM argument {arg} needs a value")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"vLLM argument {flag}: expected an integer >= 1, got {value!r}")
        sizes[which] = int(value)
    return sizes[0], sizes[1]


def model_max_len(model: Path, wanted: int) -> int:
    """``wanted``, capped by the model's max_position_embeddings when its config says."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return wanted
    limit = config.get("max_position_embeddings")
    return min(wanted, int(limit)) if isinstance(limit, int) and limit > 0 else wanted


def proxy_flags() -> set[str]:
    """Option strings `tracedpush proxy` accepts (its parser is the source of truth)."""
    import argparse

    from tracedpush.proxy import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return {opt for action in parser._actions for opt in action.option_strings}


def proxy_argv(
    mode: Mode,
    prefills: list[EngineSpec],
    decodes: list[EngineSpec],
    host: str,
    port: int,
    traces_dir: Path | None,
    extra_args: tuple[str, ...] = (),
    python: str = sys.executable,
    flags: set[str] | None = None,
    trace_files: bool = True,
) -> list[str]:
    """`tracedpush proxy` with every engine URL and each P's NIXL coordinates explicit.

    Coordinates ride in the URL fragment (``#engine_id=...,host=...,port=...``) so the
    proxy sends P and D in parallel from the very first push request.
    ``trace_files=False`` (traced, ``traces_dir`` given): the proxy writes no trace files
    and exports over OTLP only (`tracedpush up --collect`).
    """
    flags = proxy_flags() if flags is None else flags
    argv = [python, "-m", "tracedpush", "proxy", "--mode", mode, "--port", str(port)]
    if "--host" in flags:
        argv += ["--host", host]
    for p in prefills:
        c = p.coordinates()
        fragment = (
            f"engine_id={c['engine_id']},host={c['host']},port={c['port']},"
            f"tp={c['tp_size']},pp={c['pp_size']}"
        )
        argv += ["--prefill", f"{p.url}#{fragment}"]
    for d in decodes:
        argv += ["--decode", f"{d.url}#engine_id={d.engine_id}"]
    if traces_dir is not None:
        if not trace_files:
            argv += [f for f in ("--no-trace-files",) if f in flags]
        elif "--traces" in flags:
            argv += ["--traces", str(traces_dir)]
    else:  # untraced run: no trace context in kv_transfer_params, no proxy trace files
        argv += [f for f in ("--no-trace-context", "--no-trace-files") if f in flags]
    return [*argv, *extra_args]


def traced_connectors_available() -> bool:
    """True if ``tracedpush.connector`` is a real module (checked without importing vLLM)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(TRACED_CONNECTOR_MODULE)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


COLLECT_SERVICE_NAME = "collect"


def collect_argv(
    host: str,
    http_port: int,
    metrics_port: int,
    traces_dir: Path,
    forward: str | None = None,
    extra_args: tuple[str, ...] = (),
    python: str = sys.executable,
) -> list[str]:
    """`tracedpush collect` for a local deployment: OTLP/HTTP only (every process `up`
    starts exports over HTTP; no gRPC port to collide with a local Jaeger's 4317)."""
    argv = [
        python,
        "-m",
        "tracedpush",
        "collect",
        "--traces",
        str(traces_dir),
        "--host",
        host,
        "--otlp-http-port",
        str(http_port),
        "--otlp-grpc-port",
        "0",
        "--metrics-port",
        str(metrics_port),
    ]
    if forward:
        argv += ["--forward", forward]
    return [*argv, *extra_args]


def otlp_env(endpoint: str) -> dict[str, str]:
    """What makes an engine or the proxy export to `tracedpush collect` only: OTLP/HTTP
    to `endpoint`, and no trace files (an empty TRACEDPUSH_TRACES_DIR: the connector and
    the proxy fall back to that variable when given no directory)."""
    endpoint = endpoint.rstrip("/")
    return {
        # the traces-specific variables win over the generic ones in the SDK: set both,
        # so a user's OTEL_EXPORTER_OTLP_TRACES_* cannot send the spans elsewhere
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{endpoint}/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_EXPORTER": "otlp",
        "TRACEDPUSH_TRACES_DIR": "",
    }
