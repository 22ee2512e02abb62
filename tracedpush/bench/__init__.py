"""Load generation and measurement: the workload client, `tracedpush demo`, benchmarks."""
