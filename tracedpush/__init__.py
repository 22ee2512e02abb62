"""tracedpush: per-request OpenTelemetry traces of vLLM's NIXL push/pull KV handoff."""

__version__ = "0.1.0"
