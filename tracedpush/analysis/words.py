"""A difference between two modes, in words: the largest contributions first."""

from __future__ import annotations

from collections.abc import Iterable


def delta_sentence(
    head: str,
    deltas: Iterable[tuple[str, float]],
    total: float,
    *,
    top: int,
    eps: float,
    digits: int,
    rest: str,
) -> str:
    """`head`, then the `top` largest (name, ms) contributions and what the others add up
    to, e.g. "...: step handoff +640.0 ms, WRITE +120.0 ms; other phases +12.0 ms."."""
    ranked = sorted(deltas, key=lambda kv: (-abs(kv[1]), kv[0]))
    shown = [(name, ms) for name, ms in ranked[:top] if abs(ms) >= eps]
    if not shown:
        return head + "."
    text = ", ".join(f"{name} {ms:+.{digits}f} ms" for name, ms in shown)
    left = total - sum(ms for _, ms in shown)
    tail = f"; {rest} {left:+.{digits}f} ms" if abs(left) >= eps else ""
    return f"{head}: {text}{tail}."
