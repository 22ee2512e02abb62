"""`tracedpush bench sweep`: the seed article's experiment, QPS x input length, push vs pull.

For each mode a fresh 1P1D (prefix caching off, as the launcher always serves) or the
user's own deployment; for each (input length, QPS) cell a short warm-up and then an
open-loop Poisson run at the cell's rate, with random prompts, through vLLM's own
benchmark client where vLLM is installed (`vllm_client`), else ours (`serve_client`).
Each cell writes ``<results>/<mode>-qps<q>-in<n>.json`` in `vllm bench serve
--save-result --save-detailed` format plus ``request_ids`` and a ``tracedpush`` block
(`tracedpush.analysis.bench_results`); the traces go to ``<results>/traces/<mode>/``.
A cell's file appears only once it is complete (written beside, then renamed), so an
interrupted sweep resumes by skipping the cells that have one.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tracedpush.analysis.bench_results import (
    CLOCK,
    FORMAT_VERSION,
    OURS,
    REQUEST_IDS,
    SWEEP_MANIFEST,
    BenchFormatError,
    cell_filename,
    read_result,
)
from tracedpush.bench import clock
from tracedpush.bench.vllm_client import CellRequest, run_vllm_cell, vllm_bench_available
from tracedpush.launcher.servers import installed_vllm

MODES = ("push", "pull")


@dataclass(frozen=True, slots=True)
class Profile:
    qps: tuple[float, ...]
    input_lens: tuple[int, ...]
    output_len: int
    duration: float | None = None  # seconds of arrivals per cell (prompts = qps x duration)
    num_prompts: int | None = None
    note: str = ""


PROFILES: dict[str, Profile] = {
    # 2 rates x 2 lengths x both modes in about 5 minutes on a 2-core CPU box. Rates and
    # lengths stay below what saturates a one-core prefill engine there (a 4096-token
    # prefill takes 0.6-0.8 s: at 4 QPS its queue grows without bound, and queue wait is
    # all a cell then shows).
    "quick": Profile(
        qps=(1.0, 2.0),
        input_lens=(1024, 2048),
        output_len=32,
        duration=15.0,
        note="2 rates x 2 lengths, 15 s of arrivals per cell: the CPU box's sweep",
    ),
    # The seed article's grid (1-8 QPS x 1k-16k tokens), for GPU machines.
    "seed": Profile(
        qps=(1.0, 2.0, 4.0, 8.0),
        input_lens=(1024, 2048, 4096, 8192, 16384),
        output_len=256,
        duration=60.0,
        note="the seed article's grid: 1-8 QPS x 1k-16k input, 60 s per cell",
    ),
}


@dataclass(frozen=True, slots=True)
class Cell:
    mode: str
    qps: float
    input_len: int
    pass_no: int = 1

    @property
    def filename(self) -> str:
        return cell_filename(self.mode, self.qps, self.input_len, self.pass_no)

    @property
    def label(self) -> str:
        return self.filename.removesuffix(".json")


@dataclass(slots=True)
class SweepPlan:
    """The grid and how each cell is run; `sweep.json` records it for resumes."""

    modes: tuple[str, ...]
    qps: tuple[float, ...]
    input_lens: tuple[int, ...]
    output_len: int
    num_prompts: int | None = None
    duration: float | None = None
    warmup: int = 2
    seed: int = 0
    client: str = "auto"  # "vllm" | "tracedpush" | "auto"
    passes: int = 1  # 2: push, pull, pull, push (ABBA), each pass on fresh engines
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def prompts(self, qps: float) -> int:
        """Requests in one cell: --num-prompts, else rate x duration (at least 1)."""
        if self.num_prompts is not None:
            return self.num_prompts
        assert self.duration is not None
        return max(1, math.ceil(qps * self.duration))

    def order(self) -> list[tuple[str, int]]:
        """(mode, pass) in run order: odd passes in --modes order, even passes reversed,
        so two passes make ABBA and drift over the run falls on both modes alike."""
        out: list[tuple[str, int]] = []
        for k in range(1, self.passes + 1):
            modes = self.modes if k % 2 else tuple(reversed(self.modes))
            out += [(m, k) for m in modes]
        return out

    def cells(self, mode: str, pass_no: int = 1) -> list[Cell]:
        """A mode's cells in one pass, shortest prompts and lowest rate first."""
        return [Cell(mode, q, n, pass_no) for n in self.input_lens for q in self.qps]

    def grid(self) -> dict[str, Any]:
        """What must match for a resumed sweep to reuse finished cells."""
        return {
            "qps": list(self.qps),
            "input_lens": list(self.input_lens),
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "duration": self.duration,
            "seed": self.seed,
        }  # not `passes`: a second pass can be added to a finished sweep

    @property
    def max_model_len(self) -> int:
        """Context the engines need: the longest prompt, its output, and slack for the
        random prompts' re-tokenization (a decoded-then-encoded prompt can grow)."""
        return max(self.input_lens) + self.output_len + 64


@dataclass(frozen=True, slots=True)
class Target:
    """Where a mode's cells are sent: a proxy URL, the model for tokenizing, the traces."""

    proxy_url: str
    model_name: str
    tokenizer: str
    traces: Path | None  # where the traces of this mode land, if known


def cell_done(path: Path) -> bool:
    """A finished cell: a readable result with our block (resume skips it)."""
    if not path.is_file():
        return False
    try:
        result = read_result(path)
    except (BenchFormatError, OSError, ValueError):
        return False
    return isinstance(result.data.get(OURS), dict) and result.data[OURS].get("complete") is True


def _relative(path: Path | None, base: Path) -> str | None:
    if path is None:
        return None
    try:
        return os.path.relpath(path, base)
    except ValueError:  # another drive
        return str(path)


def annotate(
    data: dict[str, Any],
    cell: Cell,
    plan: SweepPlan,
    prefix: str,
    target: Target,
    results_dir: Path,
    client: str,
    started: float,
    clock: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """vLLM's result plus our keys: the request ids row by row, the cell, and the
    client's clock (`bench.clock`)."""
    n = len(data.get("ttfts", []))
    data[REQUEST_IDS] = [f"{prefix}{i}" for i in range(n)]
    data[OURS] = {
        "version": FORMAT_VERSION,
        "complete": True,
        "mode": cell.mode,
        "qps": cell.qps,
        "input_len": cell.input_len,
        "output_len": plan.output_len,
        "num_prompts": plan.prompts(cell.qps),
        "warmup": plan.warmup,
        "seed": plan.seed,
        "pass": cell.pass_no,
        "request_id_prefix": prefix,
        "client": client,
        "proxy_url": target.proxy_url,
        "traces": _relative(target.traces, results_dir),
        "started_unix": started,
        "run_id": plan.run_id,
    }
    if clock is not None:
        data[OURS][CLOCK] = clock
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write then rename, so a reader (or a resume) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class CellRunner:
    """Runs one cell's warm-up and measured run with the chosen client."""

    def __init__(self, plan: SweepPlan, results_dir: Path) -> None:
        self.plan = plan
        self.results_dir = results_dir
        self.client = resolve_client(plan.client)

    def request(self, cell: Cell, target: Target, n: int, rate: float, prefix: str) -> CellRequest:
        return CellRequest(
            base_url=target.proxy_url,
            model_name=target.model_name,
            tokenizer=target.tokenizer,
            num_prompts=n,
            input_len=cell.input_len,
            output_len=self.plan.output_len,
            request_rate=rate,
            seed=self.plan.seed,
            request_id_prefix=prefix,
            max_concurrency=1 if math.isinf(rate) else None,
            show_progress=not math.isinf(rate),
        )

    def run(self, cell: Cell, target: Target) -> tuple[Path, dict[str, Any]]:
        """Warm up, measure, annotate, write; the result file's path and its content."""
        tag = f"{self.plan.run_id}{uuid.uuid4().hex[:4]}"
        logs = self.results_dir / "logs" / cell.mode
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{cell.label}.log", "a", encoding="utf-8") as log:
            if self.plan.warmup:
                warm = self.request(
                    cell, target, self.plan.warmup, math.inf, f"warmup-{tag}-{cell.label}-"
                )
                self._run(warm, None, log)
            prefix = f"sweep-{tag}-{cell.label}-"
            req = self.request(cell, target, self.plan.prompts(cell.qps), cell.qps, prefix)
            started = time.time()
            partial = self.results_dir / f".{cell.filename}.partial"
            before = clock.reading()
            data = self._run(req, partial, log)
            measured = clock.client_clock(target.proxy_url, before, clock.reading())
        data = annotate(
            data, cell, self.plan, prefix, target, self.results_dir, self.client, started, measured
        )
        out = self.results_dir / cell.filename
        write_json(out, data)
        partial.unlink(missing_ok=True)
        return out, data

    def _run(self, req: CellRequest, save: Path | None, log: io.TextIOBase) -> dict[str, Any]:
        if self.client == "vllm":
            result_dir, name = (save.parent, save.name) if save is not None else (None, None)
            data = asyncio.run(run_vllm_cell(req, result_dir, name, log))
            if save is not None:  # vLLM saved it; read what it wrote, as a user would
                data = json.loads(save.read_text())
            return data
        from tracedpush.bench.serve_client import run_cell

        data = asyncio.run(
            run_cell(
                base_url=req.base_url,
                model=req.model_name,
                model_id=req.tokenizer,
                tokenizer_path=req.tokenizer,
                num_prompts=req.num_prompts,
                input_len=req.input_len,
                output_len=req.output_len,
                request_rate=req.request_rate,
                seed=req.seed,
                request_id_prefix=req.request_id_prefix,
                max_concurrency=req.max_concurrency,
                progress=req.show_progress,
            )
        )
        if save is not None:
            write_json(save, data)
        return data


def resolve_client(choice: str) -> str:
    """ "vllm" where vLLM's benchmark library imports, else "tracedpush"; a named client
    that cannot run here is an error rather than a silent switch."""
    if choice == "auto":
        return "vllm" if vllm_bench_available() else "tracedpush"
    if choice == "vllm" and not vllm_bench_available():
        raise SystemExit(
            "tracedpush bench sweep: --client vllm needs vLLM installed (vllm.benchmarks)"
        )
    return choice


def client_label(client: str) -> str:
    installed = installed_vllm() if client == "vllm" else None
    return f"vllm {installed[1]}" if installed else client


def load_manifest(results_dir: Path, plan: SweepPlan, force: bool) -> SweepPlan:
    """Resume: the same grid reuses finished cells (and the run id); a different grid in
    the same directory is refused unless --force, which starts over."""
    path = results_dir / SWEEP_MANIFEST
    if not path.is_file() or force:
        return plan
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return plan
    if old.get("grid") != plan.grid():
        raise SystemExit(
            f"tracedpush bench sweep: {results_dir} holds a sweep of another grid "
            f"({old.get('grid')}); use another --results directory, or --force to redo it"
        )
    return replace(plan, run_id=old.get("run_id", plan.run_id))


def write_manifest(results_dir: Path, plan: SweepPlan, extra: dict[str, Any]) -> None:
    data = {"grid": plan.grid(), "run_id": plan.run_id, "plan": asdict(plan), **extra}
    write_json(results_dir / SWEEP_MANIFEST, data)


class Progress:
    """One bar over cells (tqdm when there, lines otherwise); requests get vLLM's own
    bar (or ours) underneath."""

    def __init__(self, total: int, done: int) -> None:
        self.total = total
        self.bar: Any = None
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc="cells", unit="cell", position=0)
        except ImportError:
            pass
        self.done = done

    def say(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(f"[sweep] {msg}", file=sys.stderr)
        else:
            print(f"[sweep] {msg}", file=sys.stderr, flush=True)

    def advance(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
        else:
            self.say(f"{self.done}/{self.total} cells ({label} done)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
