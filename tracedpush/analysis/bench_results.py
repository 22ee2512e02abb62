"""Benchmark result files: `vllm bench serve --save-result --save-detailed` JSON.

A sweep cell (``tracedpush bench sweep``) writes one such file, with vLLM's keys, units
and per-request arrays untouched, so vLLM's own readers take it; it adds two keys of its
own: ``request_ids`` (aligned with ``ttfts``) and a ``tracedpush`` block (mode, rate,
lengths, where the traces are). A file written by ``vllm bench serve`` itself has
neither: its request ids are ``<--request-id-prefix><i>`` for row ``i`` (vLLM's
random and ShareGPT datasets number requests that way), and the prefix is given or
inferred from the traces (`tracedpush.analysis.bench`).

Pure Python, no vLLM: ``report --bench`` and the console read these on a laptop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

OURS = "tracedpush"  # our block in a result file
FORMAT_VERSION = 1
REQUEST_IDS = "request_ids"
CLOCK = "clock"  # in our block: `ClientClock`
# What --save-detailed adds per request; every array has one entry per request sent.
DETAILED_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "generated_texts",
    "errors",
)
SWEEP_MANIFEST = "sweep.json"  # a sweep directory's config and cell list


class BenchFormatError(ValueError):
    """A file that is not a `vllm bench serve --save-detailed` result."""


def rate_text(qps: float) -> str:
    """1.0 -> "1", 0.5 -> "0.5": the rate as it appears in a cell's name."""
    return f"{qps:g}"


def cell_filename(mode: str, qps: float, input_len: int, pass_no: int = 1) -> str:
    """``<mode>-qps<q>-in<n>.json``, the name of one sweep cell's result file; a second
    ABBA pass's is ``<mode>-qps<q>-in<n>-pass2.json``."""
    suffix = f"-pass{pass_no}" if pass_no > 1 else ""
    return f"{mode}-qps{rate_text(qps)}-in{input_len}{suffix}.json"


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One request as the benchmark client measured it (seconds, like vLLM)."""

    index: int
    request_id: str | None
    ttft_s: float | None  # None: the request failed before a first token
    tpot_s: float | None  # (latency - ttft) / (output tokens - 1), vLLM's definition
    latency_s: float | None
    input_len: int | None
    output_len: int | None
    error: str  # "" when the request succeeded
    start_s: float | None = None  # the client's time.perf_counter() as it sent the request

    @property
    def ok(self) -> bool:
        return not self.error and self.ttft_s is not None


@dataclass(frozen=True, slots=True)
class ClientClock:
    """How to read the client's per-request start times (``time.perf_counter()``, which
    is CLOCK_MONOTONIC on Linux) on the Unix clock the proxy's spans use: two (perf
    counter, Unix) readings taken by the sweep before and after the cell, on the client's
    host. Only recorded when the proxy runs on that host, so the two share one clock:
    then the proxy's window of a request (receipt -> first token sent) lies inside the
    client's (sent -> first token received) by causality, and what is outside it is
    measured, not estimated (`analysis.bench`)."""

    readings: tuple[tuple[int, int], ...]  # (perf_counter ns, Unix ns), in time order

    def unix_ms(self, perf_s: float) -> float:
        """A perf_counter time as Unix milliseconds, the offset interpolated between
        the readings (NTP may slew the Unix clock a little during a cell)."""
        (p0, u0), (p1, u1) = self.readings[0], self.readings[-1]
        off0, off1 = u0 - p0, u1 - p1
        frac = 0.0 if p1 == p0 else min(max((perf_s * 1e9 - p0) / (p1 - p0), 0.0), 1.0)
        return (perf_s * 1e9 + off0 + (off1 - off0) * frac) / 1e6

    @property
    def drift_ms(self) -> float:
        """How far the two clocks moved apart over the cell."""
        (p0, u0), (p1, u1) = self.readings[0], self.readings[-1]
        return abs((u1 - p1) - (u0 - p0)) / 1e6

    @classmethod
    def parse(cls, block: Any) -> ClientClock | None:
        if not isinstance(block, dict) or block.get("proxy_on_this_host") is not True:
            return None
        raw = block.get("readings")
        if not isinstance(raw, list) or not raw:
            return None
        pairs = [tuple(r) for r in raw if isinstance(r, list) and len(r) == 2]
        if len(pairs) != len(raw) or not all(type(x) is int for p in pairs for x in p):
            return None
        return cls(tuple(sorted(pairs)))  # type: ignore[arg-type]


@dataclass(slots=True)
class BenchResult:
    """One result file: the client's rows and what cell of a sweep it was."""

    path: Path
    data: dict[str, Any]
    rows: list[BenchRow]
    mode: str | None  # "push"/"pull" from our block; None for vLLM's own file
    qps: float | None  # request_rate; None when it was "inf"
    input_len: int | None
    output_len: int | None
    request_id_prefix: str | None
    traces: Path | None  # absolute; None when the file does not say
    clock: ClientClock | None = None  # the client shared the proxy's clock (our block)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def has_ids(self) -> bool:
        return any(r.request_id is not None for r in self.rows)

    def with_prefix(self, prefix: str) -> BenchResult:
        """The same result with row i's id set to ``prefix + str(i)``."""
        rows = [replace(r, request_id=f"{prefix}{r.index}") for r in self.rows]
        return replace(self, rows=rows, request_id_prefix=prefix)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _tpot(ttft: float | None, latency: float | None, output_len: int | None) -> float | None:
    if ttft is None or latency is None or output_len is None or output_len <= 1:
        return None
    return (latency - ttft) / (output_len - 1)


def _median_int(values: Sequence[Any]) -> int | None:
    ints = sorted(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return ints[len(ints) // 2] if ints else None


def parse_result(data: Any, path: Path) -> BenchResult:
    """A loaded result JSON as rows; `BenchFormatError` names what is missing."""
    if not isinstance(data, dict):
        raise BenchFormatError(f"{path}: not a JSON object")
    missing = [k for k in DETAILED_KEYS if not isinstance(data.get(k), list)]
    if missing:
        raise BenchFormatError(
            f"{path}: no per-request arrays {', '.join(missing)} "
            "(was it saved with `vllm bench serve --save-result --save-detailed`?)"
        )
    n = len(data["ttfts"])
    uneven = [k for k in DETAILED_KEYS if len(data[k]) != n]
    if uneven:
        raise BenchFormatError(f"{path}: {', '.join(uneven)} do not have {n} entries like ttfts")
    ours = data.get(OURS) if isinstance(data.get(OURS), dict) else {}
    ids = data.get(REQUEST_IDS)
    if not (isinstance(ids, list) and len(ids) == n):
        ids = [None] * n
    rows = []
    for i in range(n):
        error = data["errors"][i] or ""
        ttft = _number(data["ttfts"][i])
        latency = _number(data["latencies"][i])
        out_len = data["output_lens"][i] if isinstance(data["output_lens"][i], int) else None
        if error or not ttft:  # vLLM writes ttft 0.0 for a request that failed
            ttft = None if error else ttft
        rows.append(
            BenchRow(
                index=i,
                request_id=str(ids[i]) if ids[i] is not None else None,
                ttft_s=ttft,
                tpot_s=_tpot(ttft, latency, out_len) if not error else None,
                latency_s=latency,
                input_len=data["input_lens"][i] if isinstance(data["input_lens"][i], int) else None,
                output_len=out_len,
                error=str(error),
                start_s=_number(data["start_times"][i]),
            )
        )
    rate = _number(data.get("request_rate"))
    traces = ours.get("traces")
    return BenchResult(
        path=path,
        data=data,
        rows=rows,
        mode=ours.get("mode"),
        qps=_number(ours.get("qps")) or rate,
        input_len=ours.get("input_len") or _median_int(data["input_lens"]),
        output_len=ours.get("output_len"),
        request_id_prefix=ours.get("request_id_prefix"),
        traces=(path.parent / traces).resolve() if isinstance(traces, str) else None,
        clock=ClientClock.parse(ours.get(CLOCK)),
    )


def read_result(path: Path) -> BenchResult:
    """One result file. vLLM's --append-result writes one JSON object per line: the last
    complete object is read."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        objs = [line for line in text.splitlines() if line.strip()]
        try:
            data = json.loads(objs[-1]) if objs else None
        except json.JSONDecodeError as exc:
            raise BenchFormatError(f"{path}: not JSON ({exc})") from exc
    return parse_result(data, path)


def result_files(path: Path) -> list[Path]:
    """A file, or every ``*.json`` under a directory that is not a trace or manifest."""
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*.json")
        if p.name != SWEEP_MANIFEST and "traces" not in p.relative_to(path).parts
    )


def load_results(paths: Path | str | Iterable[Path | str]) -> tuple[list[BenchResult], list[str]]:
    """Every result file under `paths`, and one message per file that is not one.

    A directory may hold other JSON (a report, a manifest): those are skipped with a
    message rather than failing the whole load; a single file that is not a result is
    an error (`BenchFormatError`).
    """
    items = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    results: list[BenchResult] = []
    skipped: list[str] = []
    for item in items:
        if not item.exists():
            raise FileNotFoundError(f"{item}: no such file or directory")
        for f in result_files(item):
            try:
                results.append(read_result(f))
            except (BenchFormatError, OSError, UnicodeDecodeError) as exc:
                if item.is_file():
                    raise BenchFormatError(str(exc)) from exc
                skipped.append(str(exc))
    return results, skipped
