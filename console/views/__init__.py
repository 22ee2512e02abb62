"""One Streamlit page per module; `console/app.py` registers them with st.navigation.

Not named ``pages/``: a ``pages/`` folder beside the entry script turns on Streamlit's
legacy file-based pages, which run a page's file on its own (no navigation, no sidebar)
when its URL is opened before the root page.
"""
