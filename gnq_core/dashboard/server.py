"""The dashboard served behind its HTTP gate (gate.py): ``gnq dashboard`` runs ``streamlit run``
on this file, which serves main.py as an ASGI app whose every request, uploads and downloads
included, needs the token when one is set.  Streamlit reads .streamlit/config.toml beside it."""

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from gnq_core.dashboard.gate import TokenGate

app = st.App(Path(__file__).with_name("main.py"), middleware=[Middleware(TokenGate)])
