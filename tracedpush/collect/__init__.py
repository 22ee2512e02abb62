"""`tracedpush collect`: an OTLP receiver that stores, forwards and measures traces.

Modules, in the order a span goes through them: `receivers` (OTLP/HTTP, OTLP/gRPC,
/metrics), `decode` (request bodies -> OTLP JSON and analysis spans), `collector` (one
request's path: `store`, `forward`, `assemble`, then the analysis thread), `metrics`
(the Prometheus series), `service` (listeners started and stopped together) and
`command` (the CLI). It reads the analysis and writes through telemetry's JSONL writer,
never vLLM or the connector (an import-linter contract). docs/collect.md.
"""
