"""One sweep cell through vLLM's own benchmark client (`vllm bench serve`, in process).

Where vLLM is installed the sweep does not re-implement arrivals or metrics: it builds
the arguments `vllm bench serve` would parse, with vLLM's own parser, and awaits
`vllm.benchmarks.serve.main_async`. The result file is therefore vLLM's, key for key;
the sweep only adds its own keys afterwards (`tracedpush.bench.sweep`). vLLM prints its
summary on stdout: that goes to the cell's log, the progress bar (stderr) stays.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def vllm_bench_available() -> bool:
    """True when vLLM's benchmark library can be imported here."""
    try:
        return importlib.util.find_spec("vllm.benchmarks.serve") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class CellRequest:
    """What one client run sends: the same for vLLM's client and ours."""

    base_url: str  # the proxy, e.g. http://127.0.0.1:8000
    model_name: str  # what requests put in "model" (the served name)
    tokenizer: str  # a tokenizer vLLM's client can load: the model directory
    num_prompts: int
    input_len: int
    output_len: int
    request_rate: float  # requests/s; inf: all at once
    seed: int
    request_id_prefix: str
    max_concurrency: int | None = None
    show_progress: bool = True


def vllm_argv(req: CellRequest, result_dir: Path | None, result_filename: str | None) -> list[str]:
    """The `vllm bench serve` command line for `req` (also printed for reproduction)."""
    argv = [
        "--backend", "vllm",
        "--base-url", req.base_url,
        "--endpoint", "/v1/completions",
        "--model", req.tokenizer,
        "--served-model-name", req.model_name,
        "--tokenizer", req.tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(req.input_len),
        "--random-output-len", str(req.output_len),
        "--num-prompts", str(req.num_prompts),
        "--request-rate", str(req.request_rate),
        "--seed", str(req.seed),
        "--request-id-prefix", req.request_id_prefix,
        "--ignore-eos",
        "--temperature", "0",
        "--num-warmups", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
    ]  # fmt: skip
    if req.max_concurrency:
        argv += ["--max-concurrency", str(req.max_concurrency)]
    if not req.show_progress:
        argv.append("--disable-tqdm")
    if result_dir is not None and result_filename is not None:
        argv += [
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(result_dir),
            "--result-filename",
            result_filename,
        ]
    return argv


async def run_vllm_cell(
    req: CellRequest,
    result_dir: Path | None = None,
    result_filename: str | None = None,
    log: io.TextIOBase | None = None,
) -> dict[str, Any]:
    """Run `vllm bench serve` on `req` in this process; its result dict (also saved to
    ``result_dir/result_filename`` when both are given, exactly as vLLM saves it)."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _quiet_exit()

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(vllm_argv(req, result_dir, result_filename))
    out = log if log is not None else io.StringIO()
    with contextlib.redirect_stdout(out):  # type: ignore[type-var]
        return await main_async(args)


_QUIETED: list[bool] = []


def _quiet_exit() -> None:
    """Importing vLLM loads Triton, whose nanobind module prints hundreds of "leaked
    instance" lines when the interpreter finalizes, after the command's last word. At
    exit, stderr is pointed at /dev/null for that (the command has printed everything
    by then; exit handlers registered before this one still print)."""
    if _QUIETED:
        return
    _QUIETED.append(True)

    def silence() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)

    atexit.register(silence)
