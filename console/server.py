"""The console's server process: Streamlit's own ``streamlit run``, and a thread that
loads the source while the server starts, so the first visitor does not wait for it.

``python -m tracedpush.console.server run APP [streamlit flags] -- [app args]`` takes the
same command line as ``python -m streamlit run`` (`command.streamlit_command` builds it).
Before Streamlit's CLI takes over, a daemon thread opens the source the app arguments
name (`source.from_args`, as the app does), builds or updates its analysis index,
analyses it and computes what every page's first visit reads (`derived.warm`), then
prints one line: ``tracedpush console: ready: ...`` (with where the analysis index is),
or ``... not ready`` and why (the pages say the same); a run read without an index, as
it could not be kept, gets a ``tracedpush console: note: ...`` line saying why. A
visitor who arrives meanwhile waits for the same load, never for a second one: both go
through the process's one `data.Feed` for the source.

``streamlit run console/app.py`` directly works as before, without the warm-up.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

# the warm-up's one line starts with one of these (tests and benchmarks wait for it)
READY = "tracedpush console: ready"
FAILED = "tracedpush console: not ready"
NOTE = "tracedpush console: note"  # after a ready line: what the pages also warn of
log = logging.getLogger(__name__)


def app_args(argv: list[str]) -> list[str]:
    """The app's own arguments: those after the first ``--``."""
    return argv[argv.index("--") + 1 :] if "--" in argv else []


def warm(argv: list[str]) -> None:
    """Load, analyse and derive the source `argv` names; print one line saying how it went.
    Never raises: a source that fails here fails the same way on the page, with its message."""
    from tracedpush.console import data, derived
    from tracedpush.console.source import from_args

    started = time.perf_counter()
    source = from_args(argv)
    if source.kind == "none":
        return
    try:
        feed = data.feed(source)
        snap = feed.snapshot()
        derived.warm(snap)
    except data.SourceError as err:
        print(f"{FAILED}: {err}", flush=True)
        return
    except Exception:  # a bug must not take the server down: the page shows it too
        log.exception("warming the console on %s failed", source.label)
        return
    took = time.perf_counter() - started
    n = len(snap.run.requests)
    if n:
        kept = f"; analysis index in {feed.index_dir}" if feed.index_dir else ""
        print(f"{READY}: {n:,} requests from {source.label} in {took:.1f} s{kept}", flush=True)
        if snap.index_unavailable:  # what every page says too
            print(f"{NOTE}: {snap.index_unavailable}", flush=True)
        return
    level, text = data.no_requests_message(snap)  # what the pages say too
    print(f"{FAILED if level == 'warning' else READY}: {text}", flush=True)


def main() -> None:
    from streamlit.web import cli  # imported first: the warm-up's imports then share it

    threading.Thread(
        target=warm, args=(app_args(sys.argv),), name="console-warm", daemon=True
    ).start()
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
