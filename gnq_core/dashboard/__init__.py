"""The Streamlit dashboard, the top layer: nothing else in gnq_core imports it (``gnq dashboard``
starts server.py by file path), and it uses the other packages' facades only."""
