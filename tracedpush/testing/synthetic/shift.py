"""Clock skew injection: move one instance's timestamps in OTLP JSON documents or files.

Works on any traces (generated or real), so tests can skew a known-good run and check
that the analysis finds and corrects the offset.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracedpush import semconv as sc


def shift_documents(
    docs: Iterable[dict[str, Any]], instance: str, delta_ms: float, *, own_hosts: bool = False
) -> list[dict[str, Any]]:
    """Copies of OTLP `TracesData` documents with every timestamp of one instance
    (resource ``service.instance.id``) moved by `delta_ms`: a clock `delta_ms` ahead.
    `own_hosts`: also rename every instance's ``host.name`` to its instance id, so a
    one-host run reads as one host per instance (whose clocks are not tied)."""
    delta = round(delta_ms * 1e6)
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        for rs in doc.get("resourceSpans") or ():
            res_attrs = (rs.get("resource") or {}).get("attributes") or ()
            attrs = {a["key"]: a["value"] for a in res_attrs}
            inst = attrs.get(sc.RES_SERVICE_INSTANCE_ID, {}).get("stringValue")
            if own_hosts and inst is not None:
                for a in res_attrs:
                    if a["key"] == sc.RES_HOST_NAME:
                        a["value"] = {"stringValue": inst}
            if inst != instance:
                continue
            for ss in rs.get("scopeSpans") or ():
                for s in ss.get("spans") or ():
                    for key in ("startTimeUnixNano", "endTimeUnixNano"):
                        s[key] = str(int(s[key]) + delta)
                    for ev in s.get("events") or ():
                        ev["timeUnixNano"] = str(int(ev["timeUnixNano"]) + delta)
        out.append(doc)
    return out


def shift_directory(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    instance: str,
    delta_ms: float,
    *,
    own_hosts: bool = False,
) -> int:
    """Copy a traces directory, shifting one instance's clock (and with `own_hosts`,
    giving each instance its own host; see `shift_documents`); returns lines written.
    Lines that do not parse are copied unchanged."""
    src, dst = Path(src), Path(dst)
    n = 0
    for f in sorted(src.rglob("*.json*")):
        if f.suffix not in (".json", ".jsonl") or not f.is_file():
            continue
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        with f.open() as fin, target.open("w") as fout:
            for line in fin:
                try:
                    doc = json.loads(line)
                except ValueError:
                    fout.write(line)
                    continue
                (doc,) = shift_documents([doc], instance, delta_ms, own_hosts=own_hosts)
                fout.write(json.dumps(doc, separators=(",", ":")) + "\n")
                n += 1
    return n
