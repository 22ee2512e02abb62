"""The tiny local Qwen2 model everything runs on by default (built offline, deterministic)."""

from tracedpush.model.build import (
    SPEC,
    TinyQwen2Spec,
    build_model,
    default_model_dir,
    ensure_model,
    is_complete,
    read_manifest,
)

__all__ = [
    "SPEC",
    "TinyQwen2Spec",
    "build_model",
    "default_model_dir",
    "ensure_model",
    "is_complete",
    "read_manifest",
]
