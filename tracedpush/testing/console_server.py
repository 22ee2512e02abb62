"""The console in a background process on a free port, for browser tests and benchmarks.

The user's way to run it is `tracedpush console` (`tracedpush.console.command`); this
starts the same Streamlit command line and waits until it is healthy (`wait_ready`: also
until its warm-up has loaded the source).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from tracedpush.console.command import streamlit_command
from tracedpush.console.server import FAILED, READY
from tracedpush.testing.net import free_port


class ConsoleServer:
    """The console in a background process on a free port (tests, benchmarks)::

    with ConsoleServer(["--traces", "traces/"]) as server:
        server.url  # http://127.0.0.1:PORT, healthy
    """

    def __init__(
        self,
        app_args: list[str],
        *,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.app_args = app_args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ConsoleServer:
        out = self.log_path.open("wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            streamlit_command(self.app_args, port=self.port),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise TimeoutError(f"the console did not answer on {self.url} in {self.timeout} s")

    def wait_ready(self, timeout: float = 120.0) -> str:
        """The line the server's warm-up prints once the source is loaded and analysed
        (`console.server.READY`, or `FAILED` and why); needs ``log_path``."""
        if self.log_path is None:
            raise ValueError("wait_ready reads the server's log: give log_path")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith((READY, FAILED)):
                    return line
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {self.proc.returncode}")
            time.sleep(0.1)
        raise TimeoutError(f"the console's warm-up said nothing in {timeout} s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
