"""A local P/D deployment (vLLM prefill + decode engines and our proxy) as a context manager.

The one Python API that `tracedpush up`, `tracedpush demo`, the e2e fixtures and the
benchmarks share, so all of them run the exact same processes::

    with Deployment(DeploymentConfig(mode="push", run_dir=Path("runs/x"))) as d:
        requests.post(d.proxy_url + "/v1/completions", ...)

Entering starts the engines in parallel (each engine's whole process tree pinned to its own
cores, as if on its own host: tracedpush.launcher.affinity), waits until they are healthy,
then starts the proxy (not pinned) with P's NIXL coordinates. Leaving stops everything and
records a TeardownReport (leftover processes, ports still bound) in ``.teardown``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tracedpush.launcher import engine_stop, engine_tmp, servers, shm
from tracedpush.launcher.affinity import CORES_ENV, engine_cores
from tracedpush.launcher.processes import (
    EnginesLock,
    LaunchError,
    ManagedProcess,
    TeardownReport,
    busy_ports,
    http_ok,
    session_members,
    stop_stages,
    tail,
    wait_healthy,
)
from tracedpush.launcher.servers import EngineSpec, Mode

Log = Callable[[str], None]

VLLM_KV_LEASE_S = 30  # vLLM's default kv_lease_duration (its NIXL connectors' schedulers)
LEASE_MARGIN_S = 5  # a prefill engine's drain beyond its lease: the expiry is seen at a step
ENGINE_TEARDOWN_S = 5.0  # after its --shutdown-timeout, an engine's API server exits


def _stderr(msg: str) -> None:
    print(f"[tracedpush] {msg}", file=sys.stderr, flush=True)


def default_run_dir(mode: str, root: Path | str = "runs") -> Path:
    return Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{mode}"


@dataclass
class DeploymentConfig:
    """Everything that decides what runs. Defaults are the documented 1P1D topology."""

    mode: Mode
    model: Path | None = None  # None: the tiny model, built if absent
    run_dir: Path | None = None  # None: ./runs/<timestamp>-<mode>
    traces_dir: Path | None = None  # None: <run_dir>/traces
    trace: bool = True  # False: vLLM's untraced connectors
    host: str = "127.0.0.1"
    proxy_port: int = 8000
    prefill_port: int = 8100  # the i-th prefill engine listens on prefill_port + i
    decode_port: int = 8200
    prefill_side_channel_port: int = 5600
    decode_side_channel_port: int = 5700
    num_prefill: int = 1
    num_decode: int = 1
    max_model_len: int = 4096  # ~3000-token prompts plus output
    served_model_name: str | None = None  # None: the model directory's name
    startup_timeout: float = 420.0
    stop_grace: float = 15.0
    # How long a stopping engine's requests may drain. Its vLLM --shutdown-timeout (unless
    # its args set one) is this and its teardown (`shutdown_timeout_for`); vLLM's default,
    # 0, kills EngineCore and workers at once, before the connectors flush their last
    # spans. Prefill engines drain for at least their KV lease and 5 s.
    engine_drain_timeout: int = 10
    engine_args: tuple[str, ...] = ()  # appended to every vLLM command line
    prefill_args: tuple[str, ...] = ()  # then these to prefill engines' (e.g. -tp 2)
    decode_args: tuple[str, ...] = ()  # and these to decode engines'
    platform: str | None = None  # "cpu" | "cuda"; None: from the installed vLLM
    kv_buffer_device: str | None = None  # None: the platform's device ("cpu" / "cuda")
    # GPU: the i-th engine of a role gets CUDA_VISIBLE_DEVICES=gpus[i]; () = inherit
    prefill_gpus: tuple[str, ...] = ()
    decode_gpus: tuple[str, ...] = ()
    kv_extra_config: dict[str, Any] = field(default_factory=dict)  # into kv_connector_extra_config
    proxy_args: tuple[str, ...] = ()
    start_proxy: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra env for every process
    # `tracedpush collect` in front of the trace store: the engines and the proxy export
    # OTLP/HTTP to it and write no files; it writes the store and serves /metrics
    collect: bool = False
    collect_port: int = 4318  # its OTLP/HTTP port
    collect_metrics_port: int = 9464
    collect_forward: str | None = None  # its --forward (e.g. Jaeger's http://host:4318)
    collect_args: tuple[str, ...] = ()

    def engine_args_for(self, role: str) -> tuple[str, ...]:
        """The extra vLLM arguments of `role`'s engines: every engine's, then the role's."""
        own = self.prefill_args if role == "prefill" else self.decode_args
        return (*self.engine_args, *own)

    def drain_timeout_for(self, role: str) -> int:
        """How long `role`'s engines may drain their requests as they stop:
        `engine_drain_timeout`, and for prefill engines at least their KV lease
        (`kv_lease_duration`, vLLM's default 30 s) and `LEASE_MARGIN_S`.

        A prefill engine's drain waits for finished requests whose blocks a decode engine
        may still claim (pinned for a push D that never registered, held for a pull D that
        never read) until their lease ends. A drain cut short before that is a kill that
        loses the engine's last spans and final export record; a drain with nothing
        pinned ends at once, so only a stop within a lease takes longer."""
        if role != "prefill":
            return self.engine_drain_timeout
        lease = int(self.kv_extra_config.get("kv_lease_duration", VLLM_KV_LEASE_S))
        return max(self.engine_drain_timeout, lease + LEASE_MARGIN_S)

    def shutdown_timeout_for(self, role: str) -> int:
        """vLLM's --shutdown-timeout of `role`'s engines: the one their arguments set, else
        their drain (`drain_timeout_for`) and their teardown after it
        (`engine_stop.teardown_s`, from vLLM's worker grace in their environment): vLLM
        kills an EngineCore that has not exited by then, before its scheduler flushes."""
        args = self.engine_args_for(role)
        own = [v for f, v, _ in servers.vllm_flags(args) if f == servers.SHUTDOWN_TIMEOUT_FLAG]
        if own and own[-1] is not None:
            with contextlib.suppress(ValueError):  # not a number: vLLM will say so
                return int(own[-1])
        env = {**os.environ, **self.env}
        return engine_stop.shutdown_timeout(self.drain_timeout_for(role), env)

    def proxy_api_key(self) -> str | None:
        """The key the proxy's own calls send (its `servers.API_KEY_ENV`): the first one
        that every role's engines accept (`servers.api_keys`: their ``--api-key``, else
        their environment's); None when no engine needs one.

        ValueError when the prefill and decode engines share no key: the proxy's calls,
        and each client's key (passed on to both legs), would be refused by one role."""
        env = {**os.environ, **self.env}
        needed = [
            keys
            for keys in (servers.api_keys(self.engine_args_for(r), env) for r in servers.ROLES)
            if keys
        ]
        if not needed:
            return None
        common = [k for k in needed[0] if all(k in keys for keys in needed[1:])]
        if not common:
            raise ValueError(
                "the prefill and decode engines accept no API key in common (their "
                f"{servers.API_KEY_FLAG}, else {servers.API_KEY_ENV}): a client's key goes "
                "to both, so one of them would refuse every request"
            )
        return common[0]


def _resolve(config: DeploymentConfig, log: Log) -> DeploymentConfig:
    if config.mode not in ("push", "pull"):
        raise ValueError(f"mode must be 'push' or 'pull', not {config.mode!r}")
    if config.num_prefill < 1 or config.num_decode < 1:
        raise ValueError("need at least one prefill and one decode engine")
    if config.collect and not config.trace:
        raise ValueError("collect needs tracing: drop --no-trace (trace=False)")
    if config.trace and not servers.traced_connectors_available():
        raise LaunchError(
            f"{servers.TRACED_CONNECTOR_MODULE} is not importable, so the engines cannot load "
            "the traced connectors; run untraced (--no-trace / trace=False)"
        )
    model = config.model
    if model is None:
        from tracedpush.model.build import ensure_model

        model = ensure_model(log=log)
    model = Path(model).expanduser().absolute()
    if not (model / "config.json").exists():
        raise LaunchError(f"{model} is not a model directory (no config.json)")
    run_dir = Path(config.run_dir or default_run_dir(config.mode)).absolute()
    traces_dir = Path(config.traces_dir or run_dir / "traces").absolute()
    platform = config.platform or servers.vllm_platform()
    for role, gpus, count in (
        ("prefill", config.prefill_gpus, config.num_prefill),
        ("decode", config.decode_gpus, config.num_decode),
    ):
        if gpus and len(gpus) != count:
            raise ValueError(
                f"{len(gpus)} --{role}-gpus for {count} {role} engine(s): give one per engine"
            )
    for role in servers.ROLES:
        servers.parallel_sizes(config.engine_args_for(role))  # ValueError names the flag
    config.proxy_api_key()  # ValueError when the roles share no key
    return replace(
        config,
        platform=platform,
        kv_buffer_device=config.kv_buffer_device or platform,
        model=model,
        run_dir=run_dir,
        traces_dir=traces_dir,
        served_model_name=config.served_model_name or model.name,
        max_model_len=servers.model_max_len(model, config.max_model_len),
    )


class Deployment:
    """Local 1P1D (or xPyD) deployment; see the module docstring."""

    def __init__(
        self, config: DeploymentConfig, log: Log | None = _stderr, lock: bool = True
    ) -> None:
        self.log: Log = log or (lambda _msg: None)
        self.config = _resolve(config, self.log)
        self._lock = EnginesLock(on_wait=self.log) if lock else None
        self._locked = False
        self.processes: list[ManagedProcess] = []
        self.teardown: TeardownReport | None = None
        self.startup_seconds: float | None = None
        # the engines' TMPDIR (`engine_tmp`): made as they start, removed at the stop
        self.engine_tmp: Path | None = None
        # shared-memory segments there before the engines started, and those the
        # stop removed: the engines' leaked ones (`shm`)
        self._shm_before: set[str] | None = None
        self.shm_removed: list[str] = []
        # what vLLM itself killed as each engine stopped (`engine_stop.forced_kills`)
        self.vllm_killed: dict[str, list[str]] = {}
        c = self.config
        ncpu = os.cpu_count() or 1
        on_cpu = c.platform == "cpu"  # one core per engine; a GPU engine is not pinned

        def spec(role: servers.Role, i: int, port: int, side: int, core: int) -> EngineSpec:
            tp, pp = servers.parallel_sizes(c.engine_args_for(role))
            gpus = c.prefill_gpus if role == "prefill" else c.decode_gpus
            return EngineSpec(
                role,
                i,
                c.host,
                port + i,
                side + i,
                str(core % ncpu) if on_cpu else "",
                tp_size=tp,
                pp_size=pp,
                gpus=gpus[i] if gpus else "",
            )

        self.prefills = [
            spec("prefill", i, c.prefill_port, c.prefill_side_channel_port, i)
            for i in range(c.num_prefill)
        ]
        self.decodes = [
            spec("decode", i, c.decode_port, c.decode_side_channel_port, c.num_prefill + i)
            for i in range(c.num_decode)
        ]

    # ------------------------------------------------------------------- addresses
    @property
    def mode(self) -> Mode:
        return self.config.mode

    @property
    def engines(self) -> list[EngineSpec]:
        return self.prefills + self.decodes

    @property
    def proxy_url(self) -> str:
        return f"http://{self.config.host}:{self.config.proxy_port}"

    @property
    def prefill_url(self) -> str:
        return self.prefills[0].url

    @property
    def decode_url(self) -> str:
        return self.decodes[0].url

    @property
    def prefill_urls(self) -> list[str]:
        return [e.url for e in self.prefills]

    @property
    def decode_urls(self) -> list[str]:
        return [e.url for e in self.decodes]

    @property
    def model(self) -> Path:
        assert self.config.model is not None
        return self.config.model

    @property
    def model_name(self) -> str:
        """The name clients put in ``"model"`` (vLLM's --served-model-name)."""
        assert self.config.served_model_name is not None
        return self.config.served_model_name

    @property
    def run_dir(self) -> Path:
        assert self.config.run_dir is not None
        return self.config.run_dir

    @property
    def traces_dir(self) -> Path:
        assert self.config.traces_dir is not None
        return self.config.traces_dir

    @property
    def collect_url(self) -> str | None:
        """`tracedpush collect`'s OTLP/HTTP base URL, when the deployment runs it."""
        c = self.config
        return f"http://{_display(c.host)}:{c.collect_port}" if c.collect else None

    @property
    def collect_metrics_url(self) -> str | None:
        c = self.config
        return f"http://{_display(c.host)}:{c.collect_metrics_port}/metrics" if c.collect else None

    @property
    def logs(self) -> dict[str, Path]:
        """Log file per process name (prefill, decode, proxy; prefill-1... for xPyD)."""
        names = [e.name for e in self.engines]
        if self.config.start_proxy:
            names.append("proxy")
        if self.config.collect:
            names.append(servers.COLLECT_SERVICE_NAME)
        return {n: self.run_dir / f"{n}.log" for n in names}

    def ports(self) -> dict[int, str]:
        """Every port this deployment binds -> what binds it."""
        ports = {}
        for e in self.engines:
            ports[e.port] = f"{e.name} HTTP"
            ports[e.side_channel_port] = f"{e.name} NIXL side channel"
        if self.config.start_proxy:
            ports[self.config.proxy_port] = "proxy"
        if self.config.collect:
            ports[self.config.collect_port] = "collect OTLP/HTTP"
            ports[self.config.collect_metrics_port] = "collect /metrics"
        return ports

    def urls(self) -> dict[str, str]:
        """What `tracedpush up` prints."""
        out = {}
        if self.config.start_proxy:
            out["proxy (OpenAI API)"] = f"{self.proxy_url}/v1"
        for e in self.engines:
            out[e.name] = e.url
            out[f"{e.name} metrics"] = f"{e.url}/metrics"
        if self.config.collect:
            out["collect OTLP/HTTP"] = f"{self.collect_url}/v1/traces"
            out["collect metrics"] = str(self.collect_metrics_url)
            if self.config.collect_forward:
                out["collect forwards to"] = self.config.collect_forward
        out["run dir (logs)"] = str(self.run_dir)
        out["traces dir"] = str(self.traces_dir) if self.config.trace else "(tracing off)"
        return out

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Deployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Deployment:
        """Start engines, wait for health, start the proxy. On any failure stop all."""
        try:
            self._refuse_busy_ports()  # before waiting for the lock: fail fast
            if self._lock and not self._locked:
                self._lock.acquire()
                self._locked = True
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _refuse_busy_ports(self) -> None:
        ports = self.ports()
        busy = busy_ports(ports)
        if busy:
            names = ", ".join(f"{p} ({ports[p]})" for p in busy)
            raise LaunchError(
                f"port already in use: {names}. Stop whatever listens there "
                f"(`ss -ltnp | grep :{busy[0]}`) or choose other ports."
            )

    def _start(self) -> None:
        c = self.config
        self._refuse_busy_ports()  # again: the previous lock holder may have kept one
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if c.trace:
            self.traces_dir.mkdir(parents=True, exist_ok=True)
        if self.engine_tmp is None:
            self.engine_tmp = engine_tmp.make()
        if self._shm_before is None:
            self._shm_before = shm.names()
        t0 = time.monotonic()
        if c.collect:  # first: the engines export to it from their first span
            collect, env = self.collect_process()
            collect.start(env, cwd=self.run_dir)
            self.processes.append(collect)
            self.log(
                f"collect: pid {collect.pid}, OTLP/HTTP {self.collect_url}, "
                f"metrics {self.collect_metrics_url}, log {collect.log_path}"
            )
            wait_healthy([collect], 60.0, self._progress(t0))
        self.log(
            f"starting {c.num_prefill}P{c.num_decode}D in {c.mode} mode "
            f"({'traced' if c.trace else 'untraced'} connectors), model {self.model}"
        )
        engines: list[ManagedProcess] = []
        for e in self.engines:
            proc, env = self.engine_process(e)
            proc.start(env, cwd=self.run_dir)
            self.processes.append(proc)
            engines.append(proc)
            self.log(
                f"{e.name}: pid {proc.pid}, {e.url}, {_cores_note(proc, env)}, "
                f"NIXL side channel {e.host}:{e.side_channel_port}, log {proc.log_path}"
            )
            if keys := servers.api_keys(proc.argv, {}):
                self.log(
                    f"{e.name}: its {len(keys)} API keys stay on its command line, which "
                    f"every user of this host can read ({servers.API_KEY_ENV} holds one key)"
                )
        wait_healthy(engines, c.startup_timeout, self._progress(t0))
        self.log(f"engines healthy after {time.monotonic() - t0:.0f}s")
        if c.start_proxy:
            proxy, env = self.proxy_process()
            proxy.start(env, cwd=self.run_dir)
            self.processes.append(proxy)
            self.log(f"proxy: pid {proxy.pid}, {self.proxy_url}, log {proxy.log_path}")
            wait_healthy([proxy], 60.0, self._progress(t0))
        self.startup_seconds = time.monotonic() - t0
        self.log(f"ready after {self.startup_seconds:.0f}s")

    def engine_process(self, e: EngineSpec) -> tuple[ManagedProcess, dict[str, str]]:
        """The (not yet started) server of engine ``e`` and its environment.

        Its ``cpus`` pin the engine's whole process tree to the cores of its
        ``VLLM_CPU_OMP_THREADS_BIND`` (``e.cpus`` unless ``config.env`` overrides it), or
        nothing with ``TRACEDPUSH_PIN_ENGINE_TREE=0`` (see tracedpush.launcher.affinity).
        """
        c = self.config
        budget = c.shutdown_timeout_for(e.role)
        argv = servers.engine_argv(
            c.mode,
            e,
            self.model,
            self.model_name,
            c.max_model_len,
            c.trace,
            # with collect the engines write no files: they export to it (`_otlp_env`)
            self.traces_dir if c.trace and not c.collect else None,
            c.engine_args_for(e.role),
            kv_extra_config=c.kv_extra_config,
            shutdown_timeout=budget,
            kv_buffer_device=c.kv_buffer_device or "cpu",
        )
        env = servers.engine_env(e, platform=c.platform or "cpu")
        env = {
            **env,
            **engine_tmp.env(self.engine_tmp, env),
            **self._otlp_env(),
            **c.env,
        }
        argv, env = servers.key_in_env(argv, env)  # a key in argv: any user's to read
        proc = ManagedProcess(
            e.name,
            argv,
            self.logs[e.name],
            ports=(e.port, e.side_channel_port),
            health_url=f"{e.url}/health",
            cpus=engine_cores(env),
            stops_own_tree=True,
            # D drains once P's side channel refuses (`_stop_order`), not its exit
            handover_ports=(e.side_channel_port,) if e.role == "prefill" else (),
            stop_grace=max(c.stop_grace, budget + ENGINE_TEARDOWN_S),
            slow_stop=(
                f"vLLM drains and tears it down for up to {budget}s (--shutdown-timeout), "
                "waiting for KV blocks a decode engine may still claim until their lease ends"
                if e.role == "prefill"
                else f"vLLM drains and tears it down for up to {budget}s (--shutdown-timeout)"
            ),
        )
        return proc, env

    def proxy_process(self) -> tuple[ManagedProcess, dict[str, str]]:
        """The (not yet started) proxy and its environment; not pinned to any core."""
        c = self.config
        argv = servers.proxy_argv(
            c.mode,
            self.prefills,
            self.decodes,
            c.host,
            c.proxy_port,
            self.traces_dir if c.trace else None,
            c.proxy_args,
            trace_files=not c.collect,
        )
        proxy = ManagedProcess(
            "proxy",
            argv,
            self.logs["proxy"],
            ports=(c.proxy_port,),
            health_url=f"{self.proxy_url}/health",
        )
        key = c.proxy_api_key()  # the engines' key, even when only their flags give it
        auth = {servers.API_KEY_ENV: key} if key else {}
        return proxy, {**servers.common_env(), **self._otlp_env(), **c.env, **auth}

    def _otlp_env(self) -> dict[str, str]:
        """With collect: engines and proxy export OTLP to it and write no trace files."""
        return servers.otlp_env(self.collect_url) if self.collect_url else {}

    def collect_process(self) -> tuple[ManagedProcess, dict[str, str]]:
        """The (not yet started) `tracedpush collect` and its environment; not pinned."""
        c = self.config
        argv = servers.collect_argv(
            c.host,
            c.collect_port,
            c.collect_metrics_port,
            self.traces_dir,
            c.collect_forward,
            c.collect_args,
        )
        name = servers.COLLECT_SERVICE_NAME
        proc = ManagedProcess(
            name,
            argv,
            self.logs[name],
            ports=(c.collect_port, c.collect_metrics_port),
            health_url=f"http://{_display(c.host)}:{c.collect_metrics_port}/health",
        )
        return proc, {**servers.common_env(), **c.env}

    def respawn(self, proc: ManagedProcess) -> None:
        """Start one of this deployment's processes again (the caller cleared the old one).

        A decode engine comes back under a new engine id (``decode-engine-001-r1``, ...):
        vLLM's push connector on P keeps the NIXL agent of a D it has seen, by engine id,
        and after that D restarted every WRITE to it failed with
        NIXL_ERR_REMOTE_DISCONNECT. Under a new id, P handshakes with the new agent. A
        prefill engine keeps its id: the proxy gives it to D as P's coordinates.
        """
        for i, e in enumerate(self.decodes):
            if e.name == proc.name:
                self.decodes[i] = e = replace(e, generation=e.generation + 1)
                fresh, _ = self.engine_process(e)
                proc.argv = fresh.argv
                self.log(f"{e.name}: restarting as engine id {e.engine_id}")
                break
        proc.restart()

    def _progress(self, t0: float) -> Callable[[float, list[str]], None]:
        last = [0.0]

        def report(_elapsed: float, pending: list[str]) -> None:
            now = time.monotonic() - t0
            if now - last[0] < 5.0:
                return
            last[0] = now
            what = []
            for name in pending:
                line = tail(self.logs[name], 1).strip()
                what.append(f"{name} ({line[-70:]})" if line else name)
            self.log(f"[{now:4.0f}s] still starting: " + "; ".join(what))

        return report

    def member_pids(self) -> list[int]:
        """Every live process in the sessions this deployment started (servers + children)."""
        return session_members({p.pid for p in self.processes if p.pid})

    def healthy(self, timeout: float = 10.0) -> dict[str, bool]:
        """Per-process health right now (process alive and /health answers 200).

        The timeout is generous: on 2 cores a busy engine can take seconds to answer.
        """
        return {
            p.name: p.alive() and (p.health_url is None or http_ok(p.health_url, timeout))
            for p in self.processes
        }

    def _stop_order(self) -> list[list[ManagedProcess]]:
        """Who stops before whom (docs/launcher.md, "Stopping"):

        1. the proxy: the engines abort the requests it leaves, before they drain;
        2. the prefill engines, then 3. the decode engines: a decode engine keeps the
           blocks of a request abandoned while it waited for a push WRITE until that
           request's prefill engine is gone (vLLM never frees them; the connector's
           `producer_watch` does once P's NIXL side channel refuses connections), so it
           drains only then. D's stop begins as soon as that port is free (P's
           `handover_ports`), while P's EngineCore and API server still tear down:
           2-4 s less a stop than after P's exit, and the same drain for D;
        4. the collector, which the engines export their last spans to, once all have
           exited.
        """
        by_role = [{e.name for e in self.engines if e.role == r} for r in servers.ROLES]
        engines = set().union(*by_role)
        collect = [p for p in self.processes if p.name == servers.COLLECT_SERVICE_NAME]
        rest = [p for p in self.processes if p.name not in engines and p not in collect]
        return [rest, *([p for p in self.processes if p.name in r] for r in by_role), collect]

    def stop(self) -> TeardownReport:
        """Stop every process this deployment started; safe to call twice."""
        if self.teardown is not None and not self.processes:
            return self.teardown
        blocked = _block_signals()
        try:
            stages = self._stop_order()
            stopping = {p.name for p in self.processes}
            if self.processes:
                self.log(
                    "stopping " + ", then ".join(", ".join(p.name for p in s) for s in stages if s)
                )
            report = stop_stages(
                stages,
                grace=self.config.stop_grace,
                log=self.log,
                interrupted=SecondSignal() if blocked else None,
            )
            self.processes = []
            self.teardown = report
            self._say_what_vllm_killed(stopping)
            if self.engine_tmp is not None and report.clean:  # else in use: a later sweep
                engine_tmp.remove(self.engine_tmp)
                self.engine_tmp = None
            removed: list[str] = []
            if self._shm_before is not None and report.clean:
                removed = shm.remove_new(self._shm_before)
                self.shm_removed += removed
                self._shm_before = None
            if report.clean:
                leaked = f"; removed {len(removed)} leaked shared-memory segment(s)"
                self.log(
                    f"stopped in {report.seconds:.1f}s; no process left, ports free"
                    + (leaked if removed else "")
                )
            else:
                self.log(
                    f"teardown NOT clean: leftover pids {report.leftover_pids}, "
                    f"ports still bound {report.bound_ports}"
                )
            return report
        finally:
            if self._locked and self._lock:
                self._lock.release()
                self._locked = False
            _unblock_signals(blocked)

    def _say_what_vllm_killed(self, stopped: set[str]) -> None:
        """Name each engine of `stopped` whose stop vLLM cut short (its log), and what
        that lost: a kill is silent otherwise, found later as missing spans."""
        for e in self.engines:
            if e.name not in stopped:
                continue
            killed = engine_stop.forced_kills(self.logs[e.name])
            if not killed:
                continue
            self.vllm_killed[e.name] = killed
            budget = self.config.shutdown_timeout_for(e.role)
            for what in killed:
                if what == "workers":
                    self.log(
                        f"{e.name}: vLLM killed its workers, still exiting after its "
                        f"{engine_stop.WORKER_GRACE_ENV} and a SIGTERM; they flush first, "
                        "so the report's trace completeness says whether one lost spans"
                    )
                else:
                    self.log(
                        f"{e.name}: vLLM killed its {what} when its --shutdown-timeout of "
                        f"{budget}s ran out, before it flushed: its scheduler's last spans "
                        "and final export record are lost (a longer "
                        f"--{e.role}-arg=--shutdown-timeout=N keeps them)"
                    )


def _display(host: str) -> str:
    """An address to connect to for a bind address (0.0.0.0 -> 127.0.0.1)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _cores_note(proc: ManagedProcess, env: dict[str, str]) -> str:
    """What `up` prints about an engine's cores."""
    if proc.cpus:
        cores = ",".join(map(str, proc.cpus))
        return f"core{'s' if len(proc.cpus) > 1 else ''} {cores} (whole process tree)"
    bind = env.get(CORES_ENV, "")
    return f"core {bind} (OpenMP threads only)" if bind else "cores not pinned"


def _block_signals() -> bool:
    """Hold off Ctrl-C / SIGTERM while tearing down, so a second one cannot orphan children."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    return True


class SecondSignal:
    """Whether a Ctrl-C or SIGTERM came while `_block_signals` holds them off (taken, so
    it is not raised once they are let through again); then always true.

    A stop then skips the longest waits, a prefill engine's drain through its KV lease
    (`stop_all`'s `interrupted`). Any thread can ask: a signal sent to the process stays
    pending while every thread blocks it, and the stop's threads start blocking it."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self) -> bool:
        if not self.seen:
            self.seen = signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 0) is not None
        return self.seen


def _unblock_signals(blocked: bool) -> None:
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
