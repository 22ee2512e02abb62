"""argparse types shared by `tracedpush bench` and the scripts in benchmarks/: a count or
a rate that is not a positive number stops the command at parsing, naming the flag,
rather than deep in a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type) -> Callable[[str], int | float]:
    """An argparse ``type`` that parses `kind` (int or float) and accepts only > 0."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from exc
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse
