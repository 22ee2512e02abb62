"""Bytes for the Export page's downloads (no Streamlit, so tests can check them)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pandas as pd

from tracedpush.analysis import to_perfetto


def table_csv(table: pd.DataFrame) -> bytes:
    """RunAnalysis.table() as CSV, columns as the analysis names them."""
    return table.to_csv(index=False).encode()


def perfetto_json(run: Any, trace_ids: Iterable[str] | None = None) -> bytes:
    """analysis.to_perfetto for the chosen requests (all when None), compact JSON."""
    ids = None if trace_ids is None else list(trace_ids)
    return json.dumps(to_perfetto(run, ids), separators=(",", ":")).encode()
