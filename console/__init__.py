"""The tracedpush Streamlit console: draws what `tracedpush.analysis` computes.

Run it with `tracedpush console --traces DIR` (or `--jaeger URL`), or
`streamlit run console/app.py -- --traces DIR`. Installed, this directory is the
``tracedpush.console`` package (``tracedpush/console`` is a symlink to it), so
``charts`` and ``data`` are importable without Streamlit running.
"""
