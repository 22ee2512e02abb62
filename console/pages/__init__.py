"""One Streamlit page per module; `console/app.py` registers them with st.navigation."""
