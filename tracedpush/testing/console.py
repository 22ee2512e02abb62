"""Read what the console plotted back out of an AppTest: figures as the browser gets them.

For tests of the console (tests/console): ``figure(at, "timeline")``, ``traces_of(fig,
kind="critical")``, ``messages(at)``; Plotly's binary arrays are decoded to lists.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from streamlit.testing.v1 import AppTest


def decode(value: Any) -> Any:
    """Plotly serialises numpy arrays as {"dtype", "bdata"}; give back plain lists."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        if "shape" in value:
            shape = [int(x) for x in str(value["shape"]).split(",")]
            arr = arr.reshape(shape)
        return arr.tolist()
    return value


def figures(at: AppTest) -> list[dict[str, Any]]:
    """Every Plotly figure on the page, as the JSON the browser receives."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def figure(at: AppTest, kind: str) -> dict[str, Any]:
    """The figure whose layout or traces have ``meta.kind == kind``."""
    for fig in figures(at):
        if (fig["layout"].get("meta") or {}).get("kind") == kind:
            return fig
        if any((t.get("meta") or {}).get("kind") == kind for t in fig["data"]):
            return fig
    raise AssertionError(f"no figure with {kind!r} traces; kinds: {kinds(at)}")


def kinds(at: AppTest) -> list[str]:
    return sorted({(t.get("meta") or {}).get("kind", "?") for f in figures(at) for t in f["data"]})


def traces_of(fig: dict[str, Any], **meta: Any) -> list[dict[str, Any]]:
    out = []
    for t in fig["data"]:
        m = t.get("meta") or {}
        if all(m.get(k) == v for k, v in meta.items()):
            out.append({k: decode(v) for k, v in t.items()})
    return out


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def messages(at: AppTest) -> str:
    """Every info / warning / error / caption text on the page, joined."""
    parts = [e.value for kind in ("info", "warning", "error", "caption") for e in at.get(kind)]
    return "\n".join(str(p) for p in parts)
