"""Telemetry plumbing shared by the connector and the proxy.

recorder (engine threads append tuples) -> builder (events -> spans, background thread)
-> export (bounded per-exporter queues; OTLP JSON lines files and/or OTLP gRPC/HTTP).
Nothing here imports vLLM or NIXL.
"""
