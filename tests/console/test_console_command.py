"""`tracedpush console`: the command line it builds, and where it finds the app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush.cli import main as cli_main
from tracedpush.console import command
from tracedpush.console.source import Source, from_args

REPO = Path(__file__).resolve().parents[2]


def test_app_is_found_through_the_package():
    path = command.app_path()
    assert path.is_file() and path.name == "app.py"
    assert path.resolve() == (REPO / "console" / "app.py").resolve()


def test_streamlit_command_is_headless_and_passes_the_source():
    cmd = command.streamlit_command(["--traces", "/x"], port=8600, host="0.0.0.0")
    assert cmd[:4] == [sys.executable, "-m", "tracedpush.console.server", "run"]
    assert "--server.headless=true" in cmd and "--server.port=8600" in cmd
    assert "--server.address=0.0.0.0" in cmd and "--browser.gatherUsageStats=false" in cmd
    assert cmd[cmd.index("--") + 1 :] == ["--traces", "/x"]


@pytest.mark.parametrize(
    ("argv", "app_args"),
    [
        (["--traces", "runs/x"], ["--traces", str(Path("runs/x").resolve())]),
        (
            ["--jaeger", "http://j:16686", "--lookback", "2h"],
            ["--jaeger", "http://j:16686", "--lookback", "2h"],
        ),
    ],
)
def test_cli_runs_streamlit(monkeypatch, argv, app_args, captured_streamlit):
    seen = captured_streamlit
    assert cli_main(["console", *argv, "--port", "8999"]) == 0
    cmd = seen["cmd"]
    assert "--server.port=8999" in cmd
    assert cmd[cmd.index("--") + 1 :] == app_args
    # and the app reads the same arguments back
    assert from_args(cmd[cmd.index("--") + 1 :]).kind == argv[0].lstrip("-")


def test_cli_needs_a_source(capsys):
    with pytest.raises(SystemExit):
        cli_main(["console"])
    assert "--traces" in capsys.readouterr().err


def test_source_from_args_and_environment(tmp_path):
    assert from_args(["--traces", str(tmp_path)], env={}) == Source("traces", str(tmp_path))
    assert from_args([], env={"TRACEDPUSH_JAEGER": "http://j:16686/"}) == Source(
        "jaeger", "http://j:16686"
    )
    assert from_args([], env={}).kind == "none"
    # pytest's own flags (e.g. --trace) are not mistaken for --traces
    assert from_args(["--trace", "-x", "tests/"], env={}).kind == "none"
    assert Source.parse("http://localhost:16686").kind == "jaeger"
    assert Source.parse(str(tmp_path)).location == str(tmp_path)


def test_index_dir_reaches_the_app(tmp_path, captured_streamlit, capsys):
    """`tracedpush console --traces DIR --index-dir IDX`: the app's source keeps its index
    there. With --jaeger the flag is refused, naming it."""
    seen = captured_streamlit
    traces, idx = tmp_path / "traces", tmp_path / "idx"
    assert cli_main(["console", "--traces", str(traces), "--index-dir", str(idx)]) == 0
    app_args = seen["cmd"][seen["cmd"].index("--") + 1 :]
    assert app_args == ["--traces", str(traces), "--index-dir", str(idx)]
    source = from_args(app_args, env={})
    assert source == Source.traces([str(traces)], index_dir=str(idx))
    assert source.index_dir == str(idx) and source != Source.traces([str(traces)])
    with pytest.raises(SystemExit) as stop:
        cli_main(["console", "--jaeger", "http://j:16686", "--index-dir", str(idx)])
    assert stop.value.code == 2
    assert "--index-dir is for trace files" in capsys.readouterr().err


def test_console_imports_neither_vllm_nor_nixl():
    code = (
        "import sys\n"
        "import tracedpush.console.command, tracedpush.console.data, tracedpush.console.charts\n"
        "import tracedpush.console.ui, tracedpush.console.export, tracedpush.testing.browser\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'nixl', 'torch'))\n"
        "print(bad)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_several_traces_reach_the_app_and_load_as_one_store(
    monkeypatch, tmp_path, captured_streamlit
):
    """`tracedpush console --traces ENGINES --traces PROXY`: one store, whole traces."""

    from tracedpush.console import data
    from tracedpush.testing import synthetic

    gen = synthetic.generate(8, seed=5)
    engines, proxy = tmp_path / "engines", tmp_path / "proxy"
    gen.write(engines, proxy)
    seen = captured_streamlit
    assert cli_main(["console", "--traces", str(engines), "--traces", str(proxy)]) == 0
    app_args = seen["cmd"][seen["cmd"].index("--") + 1 :]
    assert app_args == ["--traces", str(engines), "--traces", str(proxy)]
    source = from_args(app_args, env={})
    assert source.trace_paths == (str(engines), str(proxy))
    assert source.label == f"{engines}, {proxy}"
    assert Source.parse(source.label) == source  # the sidebar takes the label back
    env_source = from_args([], env={"TRACEDPUSH_TRACES": f"{engines}:{proxy}"})
    assert env_source == source
    run = data.Feed(source).snapshot().run
    assert len(run.requests) == 8 and all(r.complete for r in run.requests)
    alone = data.Feed(Source.traces([str(engines)])).snapshot().run
    assert not any(r.complete for r in alone.requests)


def test_help_says_when_the_server_is_ready(capsys):
    with pytest.raises(SystemExit):
        cli_main(["console", "--help"])
    out = capsys.readouterr().out
    assert "tracedpush console: ready: N requests" in out and "not ready" in out
