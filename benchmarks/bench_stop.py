"""How long `tracedpush up` takes to stop, two revisions side by side, A B B A.

A stop of 1P1D on this machine is mostly vLLM's own teardown (docs/launcher.md,
"Stopping"), and the machine's speed drifts within minutes: only a side-by-side run
compares two launchers. Each round starts a real push deployment (the tiny local
model, the traced connectors), sends a few requests through the proxy, sends the
launcher SIGTERM and reads the time it reports for its teardown (``stopped in X s``:
from the first SIGTERM to no process left and every port free), and the wall time
until it exited.

Each side is a git checkout (bench_abba.py's: ``git worktree add --detach``, removed
afterwards; ``.`` is the working tree) whose launcher runs as ``python -m tracedpush up`` from its
directory, so that its `tracedpush` comes first on the path. The engines and the proxy
it starts import that checkout's `tracedpush` too: the launcher puts its own root first
on their ``PYTHONPATH`` (`servers.PROJECT_ROOT`), ahead of the installed one. So a side
is its launcher, proxy and connectors, all of which take part in a stop.

    python benchmarks/bench_stop.py --a HEAD~1 --b HEAD          # 2 rounds of A B B A

Printed and written to docs/benchmarks/stop.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_abba import REPO, WORKING_TREE, _checkout, _remove  # a side's checkout

PYTHON = REPO / ".venv" / "bin" / "python"
READY = "Press Ctrl-C to stop."
STOPPED = re.compile(r"stopped in ([0-9.]+)s")
REQUEST = {"model": "tiny-qwen2", "prompt": "hello there how are you", "max_tokens": 8}


def _wait_ready(log: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while READY not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"the deployment did not start:\n{tail}")
        time.sleep(0.5)


def _post(port: int, n: int) -> None:
    body = json.dumps(REQUEST).encode()
    for _ in range(n):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()


def one_stop(code: Path, run_dir: Path, requests: int, timeout: float) -> dict[str, float]:
    """Start a push deployment from `code`, send `requests`, stop it: its teardown."""
    run_dir.mkdir(parents=True)
    log = run_dir / "launcher.log"
    with log.open("wb") as out:
        cmd = [str(PYTHON), "-m", "tracedpush", "up", "--mode", "push", "--run-dir", str(run_dir)]
        proc = subprocess.Popen(cmd, cwd=code, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_ready(log, proc, timeout)
            _post(8000, requests)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            wall = time.monotonic() - t0
        finally:
            if proc.poll() is None:  # never leave a deployment behind
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
    found = STOPPED.findall(log.read_text(errors="replace"))
    if not found or proc.returncode != 0:
        raise SystemExit(f"the stop was not clean (exit {proc.returncode}): see {log}")
    return {"stopped_s": float(found[-1]), "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="HEAD~1", help="side A: a revision, or . (HEAD~1)")
    ap.add_argument("--b", default=WORKING_TREE, help="side B: a revision, or . (.)")
    ap.add_argument("--rounds", type=int, default=2, help="A B B A rounds (2)")
    ap.add_argument("--requests", type=int, default=4, help="requests before each stop (4)")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "stop.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        sides = {}
        try:
            for name, rev in (("A", args.a), ("B", args.b)):
                sides[name] = _checkout(name, rev, Path(tmp))
            got: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
            order = [s for _ in range(args.rounds) for s in ("A", "B", "B", "A")]
            for i, name in enumerate(order, 1):
                side = sides[name]
                run = side.work / f"run-{i}"
                stop = one_stop(side.code, run, args.requests, args.startup_timeout)
                got[name].append(stop)
                print(f"[{i}/{len(order)}] {name} ({side.rev}): {stop}", flush=True)
        finally:
            for side in sides.values():
                _remove(side)
    means = {n: statistics.mean(s["stopped_s"] for s in got[n]) for n in got}
    result = {
        "sides": {n: {"rev": s.rev, "commit": s.commit} for n, s in sides.items()},
        "order": "".join(order),
        "stops": got,
        "mean_stopped_s": {n: round(m, 2) for n, m in means.items()},
        "ratio_b_over_a": round(means["B"] / means["A"], 3),
        "machine": f"{platform.node()} {platform.machine()}, Python {platform.python_version()}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(
        f"stopped in, mean: A {means['A']:.2f} s, B {means['B']:.2f} s, "
        f"B / A {result['ratio_b_over_a']}"
    )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
