"""tracedpush console entry point: page navigation and the sidebar's trace source.

streamlit run console/app.py -- --traces DIR        # or: tracedpush console --traces DIR
streamlit run console/app.py -- --jaeger http://localhost:16686
streamlit run console/app.py -- --bench runs/sweep   # a sweep's results (its traces beside)
"""

from __future__ import annotations

import streamlit as st

from tracedpush.console import data, ui
from tracedpush.console.source import Source

st.set_page_config(page_title="tracedpush console", page_icon=":material/timeline:", layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/compare_arrows:", default=True),
    st.Page("views/requests.py", title="Requests", icon=":material/scatter_plot:"),
    st.Page("views/timeline.py", title="Request timeline", icon=":material/view_timeline:"),
    st.Page("views/phases.py", title="Phases", icon=":material/stacked_bar_chart:"),
    st.Page("views/sweep.py", title="Sweep", icon=":material/ssid_chart:"),
    st.Page("views/live.py", title="Live", icon=":material/monitoring:"),
    st.Page("views/export.py", title="Export", icon=":material/download:"),
]


def sidebar() -> None:
    source = ui.current_source()
    with st.sidebar:
        st.caption("Traces")
        st.markdown(f"`{source.label}`")
        if source.index_dir:
            st.caption("Analysis index")
            st.markdown(f"`{source.index_dir}`")
        results = ui.current_bench()
        if results:
            st.caption("Benchmark results (Sweep)")
            st.markdown(f"`{results}`")
        feed = data.feed(source)
        if st.button("Reload", help="read traces that arrived since the last load"):
            try:
                new = feed.refresh()
            except data.SourceError as err:
                ui.show_error(err)
            else:
                if feed.last_error is not None:
                    ui.show_error(feed.last_error)
                else:
                    st.toast(f"{new:,} new spans" if new else "nothing new")
        with st.expander("Change source"):
            typed = st.text_input(
                "Directory, trace file or Jaeger URL",
                value="",
                placeholder="traces/ or http://localhost:16686",
            )
            if st.button("Open") and typed.strip():
                chosen = Source.parse(typed)
                if chosen.trace_paths == source.trace_paths:  # the same: its index dir too
                    chosen = source
                st.session_state[ui.SOURCE_KEY] = chosen
                st.session_state.pop(ui.REQUEST_KEY, None)
                st.rerun()


page = st.navigation(PAGES)
sidebar()
page.run()
