"""Process handling of the launcher, on stand-in servers (no vLLM): health waits, failed
starts, teardown of whole process trees, SIGKILL escalation, the parent-death backstop."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracedpush.launcher.processes import (
    EnginesLock,
    LaunchError,
    ManagedProcess,
    http_ok,
    lock_delegation_env,
    port_in_use,
    session_members,
    stop_all,
    stop_stages,
    wait_healthy,
)
from tracedpush.launcher.supervise import Supervisor
from tracedpush.testing.net import free_port
from tracedpush.testing.processes import alive

# A stand-in for vLLM's API server: serves /health, forks a child (like EngineCore) that
# sleeps, writes both pids to a file; on SIGTERM stops its child and exits, or, when
# "stubborn", ignores SIGTERM (as a hung engine would). "handover": the child listens on
# $FAKE_SIDE_PORT (a NIXL side channel) and the server, once it has reaped the child,
# tears down 1.5 s more; "stamp" notes when its SIGTERM came. Both note when they exit.
# "draining" takes $FAKE_DRAIN_S (2) s to stop, as a vLLM engine draining through a KV lease.
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, sys, time
    port, pidfile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "crash":
        print("fatal: could not load model", flush=True)
        sys.exit(3)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("ordered", "leaves_child"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the child waits for it
    child = os.fork()
    if child == 0 and mode == "handover":
        import socket
        side = socket.socket()
        side.bind(("127.0.0.1", int(os.environ["FAKE_SIDE_PORT"])))
        side.listen()
        while True:
            time.sleep(1)
    if child == 0:
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if mode in ("ordered", "leaves_child"):  # note who sent the SIGTERM, then exit
            sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
            with open(pidfile + ".sender", "w") as f:
                f.write(str(sender))
            os._exit(0)
        while True:
            time.sleep(1)
    if mode == "ok":  # like vLLM's API server: on SIGTERM, stop the child, then exit
        signal.signal(signal.SIGTERM, lambda *a: (os.kill(child, signal.SIGTERM), os._exit(0)))
    if mode == "ordered":  # ... and wait for it (vLLM with --shutdown-timeout)
        signal.signal(
            signal.SIGTERM,
            lambda *a: (os.kill(child, signal.SIGTERM), os.waitpid(child, 0), os._exit(0)),
        )
    if mode == "leaves_child":  # exits at once, its child left behind
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    def note(what):
        with open(f"{pidfile}.{what}", "w") as f:
            f.write(repr(time.time()))
    if mode == "handover":
        def slow_exit(*a):
            os.kill(child, signal.SIGTERM)
            os.waitpid(child, 0)
            time.sleep(1.5)
            note("exited")
            os._exit(0)
        signal.signal(signal.SIGTERM, slow_exit)
    if mode == "stamp":
        signal.signal(
            signal.SIGTERM,
            lambda *a: (note("sigterm"), os.kill(child, signal.SIGTERM), os._exit(0)),
        )
    if mode == "draining":  # like a vLLM engine whose drain waits out a KV lease
        def drain(*a):
            time.sleep(float(os.environ.get("FAKE_DRAIN_S", "2")))
            os.kill(child, signal.SIGTERM)
            os.waitpid(child, 0)
            os._exit(0)
        signal.signal(signal.SIGTERM, drain)
    if mode in ("ordered", "leaves_child"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    with open(pidfile, "w") as f:
        f.write(f"{os.getpid()} {child}")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def fake(tmp_path: Path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    started: list[ManagedProcess] = []

    def start(
        name: str, mode: str = "ok", own_tree: bool = False, handover: bool = False
    ) -> tuple[ManagedProcess, Path]:
        port, pidfile = free_port(), tmp_path / f"{name}.pids"
        side = free_port() if mode == "handover" else 0
        proc = ManagedProcess(
            name,
            [sys.executable, str(script), str(port), str(pidfile), mode],
            tmp_path / f"{name}.log",
            ports=(port, side) if side else (port,),
            health_url=f"http://127.0.0.1:{port}/health",
            stops_own_tree=own_tree,
            handover_ports=(side,) if handover else (),
        )
        proc.start({**os.environ, "FAKE_SIDE_PORT": str(side)})
        started.append(proc)
        return proc, pidfile

    yield start
    stop_all(started, grace=1.0)


def test_teardown_stops_server_and_its_children_and_frees_port(fake):
    a, a_pids = fake("prefill")
    b, b_pids = fake("decode")
    wait_healthy([a, b], timeout=60, interval=0.1)
    pids = [int(x) for f in (a_pids, b_pids) for x in f.read_text().split()]
    assert len(pids) == 4 and all(alive(p) for p in pids)
    assert port_in_use(a.ports[0]) and port_in_use(b.ports[0])

    report = stop_all([a, b], grace=10.0)

    assert report.clean and report.killed == []
    assert not any(alive(p) for p in pids)
    assert not port_in_use(a.ports[0]) and not port_in_use(b.ports[0])


@pytest.mark.parametrize("handover", [True, False])
def test_the_next_stage_begins_once_the_handover_ports_are_free(fake, handover):
    """A prefill engine's side channel closes as its worker exits, 2-4 s before the rest
    of it: the decode engines' stop begins then (their drain needs only that), not once
    the prefill engine has exited; the stage after them waits for every earlier one."""
    p, p_pids = fake("prefill", mode="handover", own_tree=True, handover=handover)
    d, d_pids = fake("decode", mode="stamp", own_tree=True)
    c, c_pids = fake("collector", mode="stamp")
    wait_healthy([p, d, c], timeout=60, interval=0.1)
    assert port_in_use(p.ports[1])

    report = stop_stages([[p], [d], [c]], grace=10.0)

    assert report.clean and report.killed == []
    p_exited = float(Path(f"{p_pids}.exited").read_text())
    d_signalled = float(Path(f"{d_pids}.sigterm").read_text())
    c_signalled = float(Path(f"{c_pids}.sigterm").read_text())
    if handover:  # the server's 1.5 s after its child: D's stop overlapped it
        assert d_signalled < p_exited - 0.5
    else:
        assert d_signalled >= p_exited
    assert c_signalled >= p_exited  # the collector outlives every engine
    assert not port_in_use(p.ports[1]) and session_members({p.pid, d.pid, c.pid}) == []


def test_a_server_with_a_longer_grace_drains_says_why_and_the_rest_is_killed(fake):
    """A prefill engine may drain past the stop's grace (its KV lease): it keeps its own
    `stop_grace`, its `slow_stop` is logged once the usual grace has passed, and a server
    past the usual grace beside it is still killed then, not when the drain ends."""
    drainer, drainer_pids = fake("prefill", mode="draining", own_tree=True)
    stubborn, _ = fake("stubborn", mode="stubborn")
    drainer.stop_grace, drainer.slow_stop = 10.0, "vLLM drains it through its KV lease"
    wait_healthy([drainer, stubborn], timeout=60, interval=0.1)
    logs: list[str] = []

    report = stop_all([drainer, stubborn], grace=0.5, log=logs.append)

    assert report.killed == ["stubborn"] and report.clean, report
    assert 2.0 <= report.seconds < 10.0
    said = [line for line in logs if line.startswith("prefill still stopping")]
    assert len(said) == 1 and "vLLM drains it through its KV lease" in said[0], logs
    assert "killed if it runs 10s" in said[0]
    assert not any(alive(int(p)) for p in drainer_pids.read_text().split())


# `tracedpush up`'s stop in a process of its own: Ctrl-C and SIGTERM blocked on the main
# thread (Deployment.stop), one stage per stand-in, each draining for 30 s. argv: the fake
# server, the stop's grace, then name,port,pidfile,own stop_grace ("" for none) a stage.
STOP_DRIVER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from tracedpush.launcher.deployment import SecondSignal
    from tracedpush.launcher.processes import ManagedProcess, stop_stages, wait_healthy
    fake, grace = sys.argv[1], float(sys.argv[2])
    stages = []
    for spec in sys.argv[3:]:
        name, port, pidfile, own = spec.split(",")
        p = ManagedProcess(
            name,
            [sys.executable, fake, port, pidfile, "draining"],
            Path(pidfile + ".log"),
            ports=(int(port),),
            health_url=f"http://127.0.0.1:{port}/health",
            stops_own_tree=True,
            stop_grace=float(own) if own else None,
            slow_stop="vLLM drains it" if own else "",
        )
        p.start({**os.environ, "FAKE_DRAIN_S": "30"})
        stages.append([p])
    wait_healthy([p for stage in stages for p in stage], timeout=60.0, interval=0.1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # as stop() does
    report = stop_stages(stages, grace=grace, log=print, interrupted=SecondSignal())
    print(f"done killed={report.killed} clean={report.clean} seconds={report.seconds:.1f}")
    """
)


def _stop_with_a_second_ctrl_c(
    tmp_path: Path, grace: float, servers: dict[str, str], cue: str
) -> tuple[list[str], float, list[Path]]:
    """`STOP_DRIVER` on `servers` (name: own stop_grace), a SIGINT on the first line
    with `cue`: the lines it printed, seconds from the SIGINT to its end, the pid files."""
    fake, driver = tmp_path / "fake_server.py", tmp_path / "driver.py"
    fake.write_text(FAKE_SERVER)
    driver.write_text(STOP_DRIVER)
    pidfiles = [tmp_path / f"{name}.pids" for name in servers]
    specs = [f"{n},{free_port()},{tmp_path / n}.pids,{own}" for n, own in servers.items()]
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(fake), str(grace), *specs],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    signalled = None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if signalled is None and cue in line:
            proc.send_signal(signal.SIGINT)
            signalled = time.monotonic()
        if line.startswith("done"):
            break
    assert proc.wait(timeout=30) == 0, lines
    assert signalled is not None, lines
    return lines, time.monotonic() - signalled, pidfiles


def test_a_second_ctrl_c_ends_a_drain_and_the_rest_of_the_stop_at_once(tmp_path: Path):
    """A prefill engine's drain may wait out a 30 s KV lease; a second Ctrl-C (or
    SIGTERM) while the stop holds them off kills it then, and the later stages at once
    (a decode engine's drain too), each saying its last records are lost; nothing is
    left."""
    lines, after, pidfiles = _stop_with_a_second_ctrl_c(
        tmp_path, 0.5, {"prefill": "40", "decode": ""}, "or now on a second Ctrl-C"
    )  # the slow stop said so after the usual 0.5 s
    assert after < 5.0, lines  # not 30 s, nor 30 s more for decode
    assert lines[-1].startswith("done killed=['prefill', 'decode'] clean=True"), lines
    for name in ("prefill", "decode"):
        said = [x for x in lines if x.startswith(f"{name}: killed on a second Ctrl-C")]
        assert len(said) == 1 and "is lost" in said[0], lines
    assert not any(alive(int(p)) for f in pidfiles for p in f.read_text().split())


def test_a_long_stop_says_a_second_ctrl_c_would_end_it(tmp_path: Path):
    """Any server still stopping after `HINT_AFTER_S` (8 s: a decode engine's 10 s drain)
    makes the stop say once what it waits for and what a second Ctrl-C costs; one
    then kills it."""
    lines, after, pidfiles = _stop_with_a_second_ctrl_c(
        tmp_path, 40.0, {"decode": ""}, "Ctrl-C again to kill now"
    )
    hint = [x for x in lines if "Ctrl-C again" in x]
    assert len(hint) == 1 and hint[0].startswith("still stopping 8s after SIGTERM: decode;")
    assert after < 5.0, lines
    assert lines[-1].startswith("done killed=['decode'] clean=True"), lines
    assert not any(alive(int(p)) for f in pidfiles for p in f.read_text().split())


def test_sigterm_ignoring_tree_is_killed(fake):
    proc, pidfile = fake("stubborn", mode="stubborn")
    wait_healthy([proc], timeout=60, interval=0.1)
    pids = [int(x) for x in pidfile.read_text().split()]

    report = stop_all([proc], grace=0.5)

    assert report.killed == ["stubborn"] and report.clean
    assert not any(alive(p) for p in pids)
    assert session_members({proc.pid}) == []


@pytest.mark.parametrize("own_tree", [True, False])
def test_a_server_that_stops_its_own_tree_is_signalled_alone(fake, own_tree):
    """vLLM's API server stops EngineCore and workers in order, each flushing its spans;
    a SIGTERM to the whole group reaches them at once instead (and vLLM then killed
    them mid-flush). The child notes who sent its SIGTERM."""
    proc, pidfile = fake("decode", mode="ordered", own_tree=own_tree)
    wait_healthy([proc], timeout=60, interval=0.1)

    report = stop_all([proc], grace=10.0)

    assert report.clean and report.killed == []
    sender = int(Path(f"{pidfile}.sender").read_text())
    assert sender == (proc.pid if own_tree else os.getpid())


def test_what_a_server_that_stops_its_own_tree_leaves_is_stopped_at_once(fake):
    """Its server exited without stopping its child: the group gets SIGTERM then, not a
    SIGKILL after the grace."""
    proc, pidfile = fake("decode", mode="leaves_child", own_tree=True)
    wait_healthy([proc], timeout=60, interval=0.1)
    t0 = time.monotonic()

    report = stop_all([proc], grace=10.0)

    assert report.clean and report.killed == [] and time.monotonic() - t0 < 5.0
    assert int(Path(f"{pidfile}.sender").read_text()) == os.getpid()


def test_failed_start_names_the_server_and_shows_its_log(fake):
    proc, _ = fake("decode", mode="crash")
    with pytest.raises(LaunchError) as err:
        wait_healthy([proc], timeout=60, interval=0.1)
    message = str(err.value)
    assert message.startswith("decode failed to start: exited with code 3")
    assert "fatal: could not load model" in message


def test_children_die_when_the_launcher_is_killed(tmp_path: Path):
    """PR_SET_PDEATHSIG: even a SIGKILLed launcher leaves no server behind."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    port, pidfile = free_port(), tmp_path / "pids"
    launcher = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from tracedpush.launcher.processes import ManagedProcess, wait_healthy
        p = ManagedProcess("prefill", [sys.executable, {str(script)!r}, "{port}",
                           {str(pidfile)!r}, "ok"], Path({str(tmp_path / "p.log")!r}),
                           health_url="http://127.0.0.1:{port}/health")
        p.start(dict(os.environ))
        wait_healthy([p], timeout=60, interval=0.1)
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, env=env
    )
    server = child = None
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        server, child = (int(x) for x in pidfile.read_text().split())
        assert alive(server) and alive(child)
        parent.kill()
        parent.wait()
        # The kernel sends the orphaned server SIGTERM; it shuts down as vLLM's does.
        assert wait_for(lambda: not alive(server) and not alive(child))
    finally:
        parent.kill()
        for pid in (server, child):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_port_in_use_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use(port)
    assert not port_in_use(port)


def test_engines_lock_is_reentrant_here_and_exclusive_elsewhere(tmp_path: Path):
    path = tmp_path / "engines.lock"
    probe = ["flock", "-n", str(path), "true"]
    with EnginesLock(path):
        with EnginesLock(path):
            assert subprocess.run(probe).returncode == 1
        assert subprocess.run(probe).returncode == 1  # still held by the outer level
    assert subprocess.run(probe).returncode == 0


def test_engines_lock_can_be_delegated_to_a_child(tmp_path: Path):
    path = tmp_path / "engines.lock"
    child = (
        "from tracedpush.launcher.processes import EnginesLock\n"
        "with EnginesLock(): print('inside')\n"
    )
    env = {
        **os.environ,
        "TRACEDPUSH_ENGINES_LOCK": str(path),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    with EnginesLock(path):
        delegated = subprocess.run(
            [sys.executable, "-c", child],
            env={**env, **lock_delegation_env()},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert delegated.stdout.strip() == "inside"
        # Without the delegation the child would wait: it cannot take the lock now.
        probe = "import fcntl, os\nfd = os.open(os.environ['TRACEDPUSH_ENGINES_LOCK'], os.O_RDWR)\n"
        probe += "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"
        assert subprocess.run([sys.executable, "-c", probe], env=env).returncode != 0


# ------------------------------------------------------------- --on-exit (supervise)


def _kill_tree(proc: ManagedProcess) -> None:
    """SIGKILL the server's whole session, as a user killing an engine would."""
    os.killpg(proc.pid or 0, signal.SIGKILL)
    assert wait_for(lambda: not proc.alive(), 10)


def test_restart_brings_the_dead_one_back_and_leaves_the_others_alone(fake):
    p, _ = fake("prefill")
    d, d_pids = fake("decode")
    wait_healthy([p, d], timeout=60, interval=0.1)
    p_pid, d_pid = p.pid, d.pid
    d_child = int(d_pids.read_text().split()[1])  # its "EngineCore"
    out = io.StringIO()
    sup = Supervisor([p, d], policy="restart", backoff_s=(0.2, 0.4), out=out)
    os.kill(d_pid or 0, signal.SIGKILL)  # the server dies, its child lives on
    assert wait_for(lambda: not d.alive(), 10) and alive(d_child)

    assert sup.step()  # noticed: one line naming it, with its log tail
    first = out.getvalue()
    assert f"decode (pid {d_pid}) exited unexpectedly" in first
    assert "restarting it in 0.2 s (attempt 1)" in first and "serving" in first
    assert wait_for(lambda: (sup.step(), d.alive() and d.pid != d_pid)[1], 10)
    assert wait_for(lambda: (sup.step(), "decode is healthy again" in out.getvalue())[1], 30)
    assert p.alive() and p.pid == p_pid  # the other process never noticed
    assert d.health_url and http_ok(d.health_url)
    assert d.log_path.read_text().count("fake_server.py") == 2  # one log, appended
    # what was left of the old one (its child) was cleared before the restart
    assert not alive(d_child)

    _kill_tree(d)  # crashes again soon after: backoff grows
    assert sup.step()
    assert "restarting it in 0.4 s (attempt 2)" in out.getvalue()


def test_stop_fails_fast_and_keep_leaves_it_dead(fake):
    p, _ = fake("prefill")
    d, _ = fake("decode")
    wait_healthy([p, d], timeout=60, interval=0.1)
    out = io.StringIO()
    _kill_tree(d)
    assert not Supervisor([p, d], policy="stop", out=out).step()
    assert "stopping everything (--on-exit stop)" in out.getvalue()

    keep = Supervisor([p, d], policy="keep", backoff_s=(0.0,), out=out)
    assert keep.step() and keep.step()
    assert not d.alive() and p.alive()
    assert out.getvalue().count("the others keep running") == 1  # said once
    with pytest.raises(ValueError, match="restart, stop, keep"):
        Supervisor([p], policy="retry")
