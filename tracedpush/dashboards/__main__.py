"""``python -m tracedpush.dashboards [--out DIR] [--check]``: write (or check) the
generated Grafana dashboards; `make dashboards` runs it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracedpush.dashboards.generate import render_all

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "dashboards"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracedpush.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: %(default)s")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        path = args.out / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "stale" if args.check else "wrote"
    for path in stale:
        print(f"{verb}: {path}")
    if not stale:
        print(f"up to date: {args.out}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
