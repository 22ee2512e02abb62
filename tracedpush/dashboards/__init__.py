"""Grafana dashboards generated from code (as vLLM generates its own), so every query
names the metrics and phases of `tracedpush.semconv` and `tracedpush.analysis.phases`
instead of a hand-typed copy that drifts.

``python -m tracedpush.dashboards`` (``make dashboards``) writes ``dashboards/*.json``;
``--check`` fails when the committed files are stale. Needs the ``dev`` extra
(grafana-foundation-sdk); never imports vLLM.
"""

from __future__ import annotations

from tracedpush.dashboards.generate import DASHBOARDS, build_all, render_all

__all__ = ["DASHBOARDS", "build_all", "render_all"]
