"""`tracedpush model build|info`: make the tiny test model without any network access."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tracedpush.model.build import (
    ENV_DIR,
    MODEL_NAME,
    build_model,
    default_model_dir,
    is_complete,
    read_manifest,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    build = sub.add_parser(
        "build",
        help=f"write the {MODEL_NAME} model (seeded weights, locally trained tokenizer)",
        description=f"Write the {MODEL_NAME} model: Qwen2 architecture, bf16 seeded random "
        "weights, byte-level BPE tokenizer trained on generated text. Deterministic byte for "
        "byte; nothing is downloaded. Does nothing if DIR already holds a complete build.",
    )
    build.add_argument(
        "dir",
        nargs="?",
        type=Path,
        help=f"target directory (default: ${ENV_DIR} or {default_model_dir()})",
    )
    build.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    info = sub.add_parser("info", help="print where the model is and its KV bytes per token")
    info.add_argument("dir", nargs="?", type=Path, help="model directory (default as for build)")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")


def _log(msg: str) -> None:
    print(f"[model] {msg}", flush=True)


def run(args: argparse.Namespace) -> int:
    model_dir = (args.dir or default_model_dir()).expanduser()
    if args.model_command == "info":
        manifest = read_manifest(model_dir)
        if manifest is None:
            print(f"{model_dir}: no {MODEL_NAME} build (run: tracedpush model build)")
            return 1
        if args.json:
            print(json.dumps(manifest, indent=2, sort_keys=True))
        else:
            state = "complete" if is_complete(model_dir) else "INCOMPLETE or outdated"
            print(f"{model_dir}: {manifest['name']} ({state})")
            print(f"  parameters: {manifest['parameters']:,}, dtype {manifest['dtype']}")
            print(
                f"  KV cache: {manifest['kv_bytes_per_token']} bytes per token "
                f"({manifest['kv_bytes_per_token_formula']})"
            )
        return 0
    start = time.perf_counter()
    try:
        path = build_model(model_dir, force=args.force, log=_log)
    except FileExistsError as exc:
        print(f"[model] error: {exc}", file=sys.stderr)
        return 1
    _log(f"ready: {path} ({time.perf_counter() - start:.1f} s)")
    return 0
