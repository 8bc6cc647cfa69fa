# Two commands do all the set-up: `make app` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: app test install lint clean

install: $(STAMP)

# The venv sees system site-packages so an installed torch (e.g. a CUDA build) is reused;
# only when no torch is importable do we install the pinned CPU build, never CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

# Builds the demo run on first start (about half a minute on 2 CPU cores), then opens the dashboard.
app: $(STAMP)
	$(VENV)/bin/gnq demo
	$(VENV)/bin/streamlit run app/main.py

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check gnq_core app tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
