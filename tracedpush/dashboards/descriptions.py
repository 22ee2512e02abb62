"""Words for panel descriptions, read from where they are already written: the phase
descriptions of `tracedpush.analysis.phases` and the trailing comments of
`tracedpush.semconv`'s constants (which are documentation, not runtime data)."""

from __future__ import annotations

import ast
import functools
import inspect
import io
import tokenize

from tracedpush import semconv
from tracedpush.analysis import phases


@functools.cache
def semconv_comments() -> dict[str, str]:
    """`{constant value: its trailing comment}` for string constants of semconv
    (``KV_PHASE_WRITE: Final = "WRITE"  # push, P: kv.write`` gives "push, P: kv.write")."""
    source = inspect.getsource(semconv)
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and (comment := comments.get(node.end_lineno or node.lineno))
        ):
            out.setdefault(node.value.value, comment)
    return out


def kv_phase(phase: str) -> str:
    """An engine-local KV phase: where semconv says it is measured, and what the same
    phase means on the critical path (analysis.phases) when it has a description there."""
    where = semconv_comments().get(phase, "")
    meaning = phases.DESCRIPTIONS.get(phase, "")
    return "; ".join(p for p in (where, meaning) if p) or phase


def ttft_phase(phase: str) -> str:
    """A critical-path phase, as the report describes it."""
    return phases.DESCRIPTIONS.get(phase, phase)


def metric(name: str) -> str:
    """What semconv says about one of our metric names (type and labels)."""
    base = name.removesuffix("_total")
    return semconv_comments().get(base, "")


def phase_list(names: tuple[str, ...], describe: object) -> str:
    """A Markdown bullet list of phases and their meaning (Grafana renders descriptions
    as Markdown)."""
    assert callable(describe)
    return "\n".join(f"* **{p}**: {describe(p)}" for p in names)
