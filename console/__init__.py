"""The tracedpush Streamlit console: draws what `tracedpush.analysis` computes.

Run it with `tracedpush console --traces DIR` (or `--jaeger URL`), or
`streamlit run console/app.py -- --traces DIR`. Installed (a wheel, or `pip install -e .`),
this directory is the ``tracedpush.console`` package (a setuptools package-dir mapping in
pyproject.toml), so ``charts`` and ``data`` are importable without Streamlit running.
"""
