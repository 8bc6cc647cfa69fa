"""The dashboard served behind its HTTP gate (app/gate.py): ``gnq dashboard`` runs
``streamlit run app/server.py``, which serves app/main.py as an ASGI app whose every request,
uploads and downloads included, needs the token when one is set."""

import streamlit as st
from starlette.middleware import Middleware

from app.gate import TokenGate

app = st.App("main.py", middleware=[Middleware(TokenGate)])
