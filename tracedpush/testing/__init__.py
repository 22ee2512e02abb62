"""Testing support, kept apart from the product: nothing under `tracedpush` imports it.

Shipped in the wheel for downstream users who test against tracedpush (a stub engine
for the proxy, realistic synthetic traces for the analysis, a headless browser for the
console), and used by tracedpush's own tests and benchmarks. Each module needs only
what it tests (the console helpers need the ``console`` and ``dev`` extras).
"""
