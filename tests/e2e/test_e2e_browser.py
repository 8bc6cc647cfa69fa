"""End to end in a real browser: upload a Trainer output folder (checkpoint-* with optimizer and
RNG state) and texts on New audit with a base model as the attack's reference, run the audit,
follow the finished job's link, read the texts on Runs without scrolling sideways, check that the
report's tables fit its page, compare with the demo run, open a shared address in a new page, lasso-select
on the dataset map and export the filtered texts.

A tiny GPT-2 (two checkpoints) and 40 AG News texts are built in tmp_path, and the store gets a demo
run over the same texts first (gnq demo's pipeline, two epochs); `streamlit run app/main.py` serves
the dashboard on a free localhost port with GNQ_DB in tmp_path; headless Chromium (Playwright)
drives it like a user. Every page must render without a Streamlit exception box; a full-page
screenshot of each (and of the Runs page in the dark theme) is saved under $GNQ_SCREENSHOTS
(default tmp_path/shots).

Needs /usr/bin/chromium: skipped when it is missing, unless GNQ_REQUIRE_BROWSER=1 (then it fails).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import lm_fixtures
import pytest
import torch

from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
RUN_NAME = "browser-audit"
N_TEXTS = 40

# (file name, url path of the st.Page — the file's stem; "" for the default page, title, must-show texts)
PAGES = [
    ("01-runs.png", "", "Runs", [RUN_NAME, "Top flagged texts"]),
    ("02-new-audit-done.png", "new_audit", "New audit", [RUN_NAME, "1. Checkpoints"]),
    ("03-trajectories.png", "trajectories", "Trajectories", [RUN_NAME]),
    ("04-extraction.png", "extraction", "Extraction vs GNQ", [RUN_NAME]),
    ("05-groups.png", "groups", "Groups", [RUN_NAME]),
    ("06-drilldown.png", "drilldown", "Text drill-down", [RUN_NAME]),
    ("07-flagged.png", "flagged", "Flagged texts", [RUN_NAME]),
    ("08-regression.png", "regression", "GNQ explained: 2D regression", []),  # no run picker here
    ("09-dataset-map.png", "dataset_map", "Dataset map", [RUN_NAME, f"All {N_TEXTS} texts"]),
]  # Compare runs (10-compare.png) is walked on its own: the user picks the demo run there


def _need_browser(reason: str) -> None:
    if os.environ.get("GNQ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (GNQ_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


# ----------------------------------------------------------------------------- test data
TRAINER_STATE = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


@pytest.fixture
def audit_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A Trainer output folder, ckpts/checkpoint-1 and ckpts/checkpoint-2 of a tiny float32 GPT-2
    (each with the optimizer, scheduler and RNG state the Trainer saves, which an audit never
    reads), the base model it started from (base/), and a text,group CSV."""
    texts = list(lm_fixtures.texts(N_TEXTS))
    assert len(texts) == N_TEXTS
    tok = train_tokenizer(texts, vocab_size=400)
    model = build_model("tiny", vocab_size=len(tok), max_length=32, seed=0,
                        eos_token_id=tok.eos_token_id).float()  # conftest makes float64 the default
    ckpts = tmp_path / "ckpts"
    save_checkpoint(model, tok, tmp_path / "base")
    gen = torch.Generator().manual_seed(1)
    for k in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        save_checkpoint(model, tok, ckpts / f"checkpoint-{k}")
        for name in TRAINER_STATE:
            (ckpts / f"checkpoint-{k}" / name).write_bytes(b"\0" * 4096)

    data = tmp_path / "texts.csv"
    with data.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "group"])
        for i, text in enumerate(texts):
            writer.writerow([text, "world" if i % 2 == 0 else "business"])
    return ckpts, data


@pytest.fixture
def demo_store(audit_inputs, tmp_path: Path) -> Path:
    """The store the dashboard starts with: a demo run over the same texts, built as `gnq demo`
    builds one (training with in-run GNQ, the audit of its checkpoints, the calibrated attack),
    two epochs instead of twelve (about 20 s on 2 CPU cores)."""
    if not CHROMIUM.exists():  # before the build: a machine without the browser skips at once
        _need_browser(f"{CHROMIUM} not found: the browser test needs Debian's chromium")
    from gnq_core.pipelines.run import run_job
    from gnq_core.pipelines.settings import DemoJob
    from gnq_core.results.store import Store

    db = tmp_path / "gnq.duckdb"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # as `gnq demo` runs (conftest makes float64 the default)
    try:
        run_job(DemoJob(out=str(tmp_path / "demo-checkpoints"), epochs=2, device="cpu",
                        data=str(audit_inputs[1])), Store(db))
    finally:
        torch.set_default_dtype(previous)
    return db


# ----------------------------------------------------------------------------- the server
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Server:
    def __init__(self, url: str, db: Path, log: Path) -> None:
        self.url, self.db, self.log = url, db, log

    def report(self) -> str:
        """The Streamlit log and every job log: printed when the test fails."""
        parts = [f"--- streamlit log ({self.log}) ---", _tail(self.log, 200)]
        for job_log in sorted((self.db.parent / "jobs").glob("*.log")):
            parts += [f"--- job log {job_log.name} ---", _tail(job_log, 60)]
        return "\n".join(parts)


@pytest.fixture
def server(tmp_path: Path, demo_store: Path):
    with serving(tmp_path, demo_store) as srv:
        yield srv


@contextlib.contextmanager
def serving(tmp_path: Path, db: Path):
    """`streamlit run app/main.py` on a free port with GNQ_DB = ``db``, until the block ends."""
    port = _free_port()
    log = tmp_path / "streamlit.log"
    env = {**os.environ, "GNQ_DB": str(db), "PYTHONUNBUFFERED": "1",
           "GNQ_DATA_ROOTS": str(tmp_path)}  # the reference model is a local path under tmp_path
    cmd = [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
           "--server.headless", "true", "--server.address", "127.0.0.1",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    srv = Server(url, db, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with code {proc.returncode}\n{srv.report()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit not healthy after 60 s\n{srv.report()}")
            time.sleep(0.5)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _stop_jobs(db)


def _stop_jobs(db: Path) -> None:
    """A job still running when the test ends (it failed half-way) is cancelled, not left behind."""
    if not (db.parent / "jobs").exists():
        return
    from gnq_core.jobs.jobs import cancel_job, list_jobs
    for job in list_jobs(db):
        if job.alive():
            cancel_job(job)


# ----------------------------------------------------------------------------- browser helpers
@pytest.fixture
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need_browser("the playwright package is not installed")
    if not CHROMIUM.exists():
        _need_browser(f"{CHROMIUM} not found")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def settle(page, timeout: float = 60.0, quiet: float = 1.0) -> None:
    """Wait until the app is connected and its script has not been running for `quiet` seconds."""
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]',
                           timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    calm_since = None
    while time.monotonic() < deadline:
        busy = page.evaluate("""() => {
            const app = document.querySelector('[data-testid="stApp"]');
            const state = app ? app.getAttribute('data-test-script-state') : 'initial';
            return state !== 'notRunning' || !!document.querySelector('[data-testid="stSkeleton"]');
        }""")
        now = time.monotonic()
        if busy:
            calm_since = None
        elif calm_since is None:
            calm_since = now
        elif now - calm_since >= quiet:
            return
        time.sleep(0.1)
    raise AssertionError(f"{page.url}: the script was still running after {timeout:.0f} s")


def app_errors(page) -> list[str]:
    """Text of every Streamlit exception box and st.error alert on the page."""
    found = []
    for sel in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
        loc = page.locator(sel)
        found += [f"{sel}: {loc.nth(i).inner_text()}" for i in range(loc.count())]
    return found


def full_screenshot(page, path: Path) -> None:
    """Streamlit scrolls inside its own container, so grow the viewport to the content first."""
    height = page.evaluate("""() => {
        let h = document.documentElement.scrollHeight;
        const sel = '[data-testid="stMain"], [data-testid="stAppViewContainer"], '
                    + '[data-testid="stAppScrollToBottomContainer"]';
        for (const el of document.querySelectorAll(sel)) {
            h = Math.max(h, el.scrollHeight);
        }
        return h;
    }""")
    width = page.viewport_size["width"]
    page.set_viewport_size({"width": width, "height": int(min(max(height, 900), 8000))})
    page.wait_for_timeout(400)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": width, "height": 900})


def body_text(page) -> str:
    """The page's visible text plus the values of its inputs (a selectbox shows its choice in one)."""
    return page.evaluate("""() => [document.body.innerText,
        ...Array.from(document.querySelectorAll('input, textarea'), el => el.value || '')].join('\\n')""")


def wait_for_text(page, text: str, timeout: float) -> None:
    page.get_by_text(text).first.wait_for(state="visible", timeout=timeout * 1000)


def wait_for_text_or_error(page, text: str, timeout: float) -> None:
    """Wait for `text`; an exception box or st.error alert showing up first fails with its message."""
    errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    page.get_by_text(text).first.or_(errors.first).wait_for(state="visible", timeout=timeout * 1000)
    found = app_errors(page)
    if found or not page.get_by_text(text).first.is_visible():
        raise AssertionError(f"{page.url}: expected {text!r}, the page shows an error instead:\n"
                             + "\n".join(found))


def nav_titles(page) -> str:
    nav = page.locator('[data-testid="stSidebarNav"]')
    return nav.inner_text() if nav.count() else ""


def lasso_left_half(page) -> None:
    """Pick the lasso in the first Plotly chart's toolbar and draw a loop around the left half of
    its plot area."""
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    chart.hover()
    chart.locator('.modebar-btn[data-val="lasso"]').first.click()
    box = chart.locator(".nsewdrag").first.bounding_box()
    x0, y0, x1, y1 = box["x"] + 3, box["y"] + 3, box["x"] + box["width"] / 2, box["y"] + box["height"] - 3
    page.mouse.move(x0, y0)
    page.mouse.down()
    for x, y in ((x1, y0), (x1, y1), (x0, y1), (x0, y0 + 5)):
        page.mouse.move(x, y, steps=12)
    page.mouse.up()


def set_form_value(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")  # commit the value without pressing Enter (which would submit the form)


def pick_option(page, testid: str, label: str, option: str) -> None:
    """Open the selectbox or multiselect labelled ``label`` and pick ``option`` from its list."""
    widget = page.locator(f'[data-testid="{testid}"]').filter(has_text=label).first
    widget.locator("input").first.click()
    page.get_by_role("option", name=option, exact=True).first.click()
    page.keyboard.press("Escape")


def download(page, button: str) -> bytes:
    """Click a download button and return the file's bytes."""
    with page.expect_download(timeout=30_000) as info:
        page.get_by_role("button", name=button).click()
    return Path(info.value.path()).read_bytes()


def shown_count(page) -> str:
    """The Flagged texts page's "N of M texts." caption."""
    return page.get_by_text(f" of {N_TEXTS} texts.").first.inner_text().split(".")[0]


def half_word(data: Path) -> str:
    """A word in some but not most of the texts (the search a user types)."""
    with data.open(newline="", encoding="utf-8") as f:
        texts = [row["text"].lower() for row in csv.DictReader(f)]
    words = sorted({w for t in texts for w in t.split() if w.isalpha() and len(w) >= 4})
    share = {w: sum(w in t for t in texts) / len(texts) for w in words}
    return min(words, key=lambda w: (abs(share[w] - 0.3), w))


def wait_for_store(server: Server, timeout: float) -> dict:
    """Poll the store (ground truth) until the run is done and attacked; fail fast on a failed job."""
    from gnq_core.jobs.jobs import list_jobs
    from gnq_core.results.store import Store

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        jobs = [j for j in list_jobs(server.db) if j.run == RUN_NAME]
        if any(j.status in ("failed", "cancelled") for j in jobs):
            raise AssertionError(f"the audit job ended {jobs[0].status}:\n{server.report()}")
        try:
            runs = Store(server.db, busy_timeout=5).runs()
        except Exception as exc:  # noqa: BLE001 (the job may hold the file; try again)
            last = repr(exc)
        else:
            row = runs[runs["name"] == RUN_NAME]
            if not row.empty:
                last = row.iloc[0].to_dict()
                if last["status"] == "done" and int(last["extraction_rows"]) > 0 and \
                        all(j.status == "done" for j in jobs):
                    return last
        time.sleep(2)
    raise AssertionError(f"run {RUN_NAME!r} not done after {timeout:.0f} s (last: {last})\n{server.report()}")


# Where the text-first tables' text cells end, against the viewport, and how far anything overflows it.
TEXTS_FIT = """() => {
    const cells = Array.from(document.querySelectorAll('table.gnq-texts td.t'));
    const boxes = [document.documentElement, ...document.querySelectorAll('[data-testid="stMain"]')];
    return {cells: cells.length, width: window.innerWidth,
            right: Math.max(0, ...cells.map(c => c.getBoundingClientRect().right)),
            overflow: Math.max(...boxes.map(b => b.scrollWidth - b.clientWidth)),
            first: cells.length ? cells[0].innerText : ''};
}"""


REPORT_WIDTHS = """() => ({page: document.documentElement.clientWidth,
    scroll: document.documentElement.scrollWidth,
    tables: Array.from(document.querySelectorAll('table'),
                       t => Math.round(t.getBoundingClientRect().right))})"""


# ----------------------------------------------------------------------------- the test
def test_upload_audit_and_browse_every_page(audit_inputs, server, browser, tmp_path):
    ckpts, data = audit_inputs
    shots = Path(os.environ.get("GNQ_SCREENSHOTS") or tmp_path / "shots")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    js_errors: list[str] = []
    page.on("pageerror", lambda exc: js_errors.append(str(exc)))
    problems: list[str] = []  # failures that do not stop the walk through the app; asserted at the end
    try:
        # --- A bookmark to a page on a freshly started server must still go through app/main.py
        # (st.navigation: page titles in the sidebar, wide layout), not run the page file alone.
        page.goto(f"{server.url}/new_audit")
        page.get_by_role("heading", name="New audit").first.wait_for(timeout=60_000)
        settle(page)
        if "GNQ explained: 2D regression" not in nav_titles(page):
            listed = " ".join(nav_titles(page).split())
            problems.append("deep link /new_audit as the first visit: the sidebar lists the files of "
                            f"app/pages/ ({listed!r}) instead of the st.navigation titles, i.e. Streamlit "
                            "ran app/pages/new_audit.py without app/main.py")

        # --- The way a user starts: the home page, then New audit from the sidebar.
        page.goto(server.url)
        page.get_by_role("heading", name="Runs").first.wait_for(timeout=60_000)
        settle(page)
        page.locator('[data-testid="stSidebarNav"]').get_by_text("New audit", exact=True).click()
        page.get_by_role("heading", name="New audit").first.wait_for(timeout=60_000)
        settle(page)
        assert urllib.parse.urlparse(page.url).path.rstrip("/").endswith("/new_audit"), page.url

        # --- Upload the checkpoint folder and the CSV, fill the settings, start.
        # (the base-model choice for PEFT adapters offers "Upload a folder" too)
        page.get_by_role("radiogroup", name="Checkpoints", exact=True).get_by_text("Upload a folder",
                                                                               exact=True).click()
        uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text="checkpoint folder")
        uploader.locator('input[type="file"]').set_input_files(str(ckpts))  # a webkitdirectory input
        wait_for_text_or_error(page, "2 checkpoint(s)", 60)
        settle(page)

        # Values typed before the dataset arrives must survive the upload's re-render.
        set_form_value(page, "Run name", RUN_NAME)
        set_form_value(page, "Max length (tokens)", "32")
        settle(page)
        page.get_by_text("Upload a file", exact=True).click()
        settle(page)
        uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text="Texts:")
        uploader.locator('input[type="file"]').set_input_files(str(data))
        wait_for_text_or_error(page, f"{N_TEXTS} texts", 60)
        settle(page)
        typed = {label: page.get_by_label(label, exact=True).input_value()
                 for label in ("Run name", "Max length (tokens)")}
        if typed != {"Run name": RUN_NAME, "Max length (tokens)": "32"}:
            problems.append(f"values typed into the form were replaced by the upload's re-render: {typed}")
            set_form_value(page, "Run name", RUN_NAME)
            set_form_value(page, "Max length (tokens)", "32")

        set_form_value(page, "Batch size", "8")
        attack = "Run the extraction attack on the last checkpoint"
        assert page.get_by_role("checkbox", name=attack).is_checked()  # its label names a help button too
        set_form_value(page, "Prefix tokens", "4")
        set_form_value(page, "Reference model (optional)", str(tmp_path / "base"))
        settle(page)
        assert not app_errors(page), app_errors(page)
        full_screenshot(page, shots / "02-new-audit.png")

        start = page.get_by_role("button", name="Start audit")
        assert start.is_enabled()
        start.click()
        wait_for_text_or_error(page, f"Started {RUN_NAME!r}", 60)

        # --- The job: the store is the ground truth, the job panel must say so too.
        row = wait_for_store(server, timeout=180)
        assert int(row["batch_size"]) == 8 and int(row["max_length"]) == 32
        assert int(row["n_examples"]) == N_TEXTS
        assert int(row["points_done"]) == int(row["points_total"]) == 2
        from gnq_core.results.store import Store
        attack = Store(server.db).run(RUN_NAME).settings["attack"]
        if attack["reference"] != str(tmp_path / "base"):
            problems.append(f"the attack's reference is {attack['reference']!r}, not the base model typed")
        kept = [p.name for p in tmp_path.rglob("*") if p.name in TRAINER_STATE and "ckpts" not in p.parts]
        if kept:
            problems.append(f"Trainer state an audit never reads was saved from the upload: {kept}")
        # --- The finished job shows when it started and how long it took, and links to its results.
        link = f"Open the results of {RUN_NAME}"
        wait_for_text_or_error(page, link, 30)
        settle(page)
        if "started " not in body_text(page) or "took " not in body_text(page):
            problems.append("the finished job does not show its start time and duration")
        page.get_by_text(link).first.click()
        page.get_by_role("heading", name="Runs").first.wait_for(timeout=60_000)
        settle(page)
        if f"run={RUN_NAME}" not in page.url:
            problems.append(f"the results link did not put the run in the address: {page.url}")
        # --- The address is a link to this view: opened in a new page it shows the same run.
        shared = browser.new_page(viewport={"width": 1400, "height": 900})
        shared.goto(page.url, timeout=60_000)
        shared.get_by_role("heading", name="Runs").first.wait_for(timeout=60_000)
        settle(shared)
        if f"Run '{RUN_NAME}'" not in body_text(shared):
            problems.append("the shared address did not open the same run")
        shared.close()
        # --- One set of numbers: the headline and the "Leaked" tile state the counts
        # every other surface states (analysis.counts.RunCounts of the store's verdict).
        from gnq_core.analysis import rank_texts, run_counts, summary
        from gnq_core.results.store import Store
        audited = Store(server.db)
        ranked = rank_texts(audited.example_totals(audited.run(RUN_NAME).run_id))
        counts = run_counts(ranked)
        if summary(ranked, counts).split(".")[0] not in body_text(page):
            problems.append(f"Runs: the headline is not {summary(ranked, counts)!r}")
        tile = page.locator('[data-testid="stMetric"]').filter(has_text="Leaked").first.inner_text()
        if f"{counts.status('leaked')} / {counts.texts}" not in tile:
            problems.append(f"Runs: the Leaked tile says {tile!r}, the counts {counts.status('leaked')} / "
                            f"{counts.texts}")
        # --- The texts read without scrolling sideways: every text cell inside the viewport, and
        # nothing wider than the page.
        fits = page.evaluate(TEXTS_FIT)
        if not fits["cells"] or fits["right"] > fits["width"] + 1 or fits["overflow"] > 1:
            problems.append(f"Runs: the texts do not fit the page without scrolling sideways: {fits}")
        if fits["cells"] and not page.get_by_text(fits["first"][:40]).first.is_visible():
            problems.append(f"Runs: the first text ({fits['first'][:40]!r}) is not visible")
        full_screenshot(page, shots / "01-runs-texts.png")
        # --- The report: its tables fit a 1200 px page.
        page.goto(f"{server.url}/extraction")
        page.get_by_role("heading", name="Extraction vs GNQ").first.wait_for(timeout=60_000)
        settle(page)
        page.get_by_role("button", name="Prepare the run's report (HTML)").click()
        settle(page)
        report = tmp_path / "report.html"
        report.write_bytes(download(page, "Download the report"))
        viewer = browser.new_page(viewport={"width": 1200, "height": 900})
        viewer.goto(report.as_uri())
        widths = viewer.evaluate(REPORT_WIDTHS)
        if not widths["tables"] or max(widths["tables"] + [widths["scroll"]]) > widths["page"]:
            problems.append(f"report: a table is wider than the 1200 px page: {widths}")
        full_screenshot(viewer, shots / "12-report.png")
        viewer.close()

        # --- Compare with the demo run (the same texts): pick it, see the comparison, in the address.
        page.goto(f"{server.url}/compare")
        page.get_by_role("heading", name="Compare runs").first.wait_for(timeout=60_000)
        settle(page)
        try:
            pick_option(page, "stSelectbox", "Compare with", "demo-audit")
            wait_for_text_or_error(page, "Texts in both", 60)
            settle(page)
            metric = page.locator('[data-testid="stMetric"]').filter(has_text="Texts in both")
            both = metric.first.inner_text()
            if str(N_TEXTS) not in both:
                problems.append(f"Compare runs: the demo run and the audit share {N_TEXTS} texts: {both!r}")
            if "vs=demo-audit" not in page.url:
                problems.append(f"Compare runs: the run compared with is not in the address: {page.url}")
        except Exception as exc:  # noqa: BLE001 (collected, reported below)
            problems.append(f"Compare runs: comparing with the demo run failed ({exc})")
        full_screenshot(page, shots / "10-compare.png")
        problems += [f"Compare runs: {e}" for e in app_errors(page)]

        # --- Every page, with the run selected (the picker defaults to the newest run).
        for shot, path, title, expected in PAGES:
            page.goto(f"{server.url}/{path}")
            try:
                page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
                settle(page)
            except Exception as exc:  # noqa: BLE001 (collected, reported below)
                problems.append(f"{title}: did not render ({exc})")
            full_screenshot(page, shots / shot)
            errors = app_errors(page)
            if errors:
                problems.append(f"{title}: " + "\n".join(errors))
            text = body_text(page)
            missing = [t for t in [title, *expected] if t not in text]
            if missing:
                problems.append(f"{title}: missing text {missing}")
        # --- Filter the flagged texts; the address carries the filters, so opened in a new page it
        # shows the same rows.
        word = half_word(data)
        with data.open(newline="", encoding="utf-8") as f:
            expected = sorted(r["text"] for r in csv.DictReader(f)
                              if r["group"] == "world" and word in r["text"].lower())
        page.goto(f"{server.url}/flagged")
        page.get_by_role("heading", name="Flagged texts").first.wait_for(timeout=60_000)
        settle(page)
        page.get_by_text("GNQ_total alone", exact=True).click()
        settle(page)
        pick_option(page, "stMultiSelect", "Groups", "world")
        settle(page)
        set_form_value(page, "Text contains", word)
        settle(page)
        filtered = shown_count(page)
        if filtered != f"{len(expected)} of {N_TEXTS} texts":
            problems.append(f"Flagged texts: group 'world' and {word!r} keep {len(expected)} texts, "
                            f"the page says {filtered!r}")
        for part in ("order=GNQ", "group=world", f"q={word}"):
            if part not in page.url:
                problems.append(f"Flagged texts: {part!r} is not in the address {page.url}")
        shared = browser.new_page(viewport={"width": 1400, "height": 900})
        shared.goto(page.url, timeout=60_000)
        shared.get_by_role("heading", name="Flagged texts").first.wait_for(timeout=60_000)
        settle(shared)
        full_screenshot(shared, shots / "11-flagged-shared-link.png")
        if shown_count(shared) != filtered or word not in body_text(shared) or \
                not shared.get_by_role("radio", name="GNQ_total alone").is_checked():
            problems.append(f"Flagged texts: the shared address shows {shown_count(shared)!r}, "
                            f"not {filtered!r}")
        original = download(page, "Download CSV")  # what the first page exports, to compare below

        # --- Lasso-select on the dataset map: the table lists only the selected texts.
        page.goto(f"{server.url}/dataset_map")
        page.get_by_role("heading", name="Dataset map").first.wait_for(timeout=60_000)
        settle(page)
        try:
            lasso_left_half(page)
            wait_for_text_or_error(page, "texts selected on the map", 30)
            settle(page)
            full_screenshot(page, shots / "09-dataset-map-lasso.png")
            caption = page.get_by_text("texts selected on the map").first.inner_text()
            selected = int(caption.split()[0].replace(",", ""))
            if not 0 < selected < N_TEXTS:
                problems.append(f"Dataset map: a lasso around half the plot selected {caption!r}")
        except Exception as exc:  # noqa: BLE001 (collected, reported below)
            problems.append(f"Dataset map: lasso selection did not filter the table ({exc})")
        # --- Export: the filtered view, the same file from the shared page; nothing to export from
        # an empty view.
        exported = download(shared, "Download CSV")
        rows = list(csv.DictReader(io.StringIO(exported.decode("utf-8"))))
        if sorted(r["text"] for r in rows) != expected:
            problems.append(f"export: {len(rows)} rows, not the {len(expected)} filtered texts")
        if exported != original:
            problems.append("export: the shared address downloads another file than the first page")
        set_form_value(shared, "Text contains", "no text says this")
        settle(shared)
        if shared.get_by_role("button", name="Download CSV").is_enabled():
            problems.append("export: the download is offered for an empty view")
        shared.close()

        # --- A drill-down address opened in a new page shows the same text.
        page.goto(f"{server.url}/drilldown?run={RUN_NAME}&text=5")
        page.get_by_role("heading", name="Text drill-down").first.wait_for(timeout=60_000)
        settle(page)
        if "#5 · rank" not in body_text(page):
            problems.append("the drill-down address ?text=5 did not open text #5")
        # --- The dark theme (the system's preference): the app and its charts are dark.
        dark = browser.new_page(viewport={"width": 1400, "height": 900}, color_scheme="dark")
        dark.goto(f"{server.url}/?run={RUN_NAME}", timeout=60_000)
        dark.get_by_role("heading", name="Runs").first.wait_for(timeout=60_000)
        settle(dark)
        dark.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=30_000)
        backgrounds = dark.evaluate("""() => [
            getComputedStyle(document.querySelector('[data-testid="stApp"]')).backgroundColor,
            ...Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] svg.main-svg'),
                          el => el.style.background || getComputedStyle(el).backgroundColor)
                 .filter(c => c)]""")
        light = [c for c in backgrounds if sum(map(float, re.findall(r"[\d.]+", c)[:3])) > 3 * 128]
        if light or len(backgrounds) < 2:
            problems.append(f"dark theme: light backgrounds {light} among {backgrounds}")
        full_screenshot(dark, shots / "01-runs-dark.png")
        dark.close()
        if js_errors:
            problems.append(f"JavaScript errors: {js_errors}")
        assert not problems, "\n\n".join(problems)
    except BaseException:
        print(server.report())
        if problems:
            print("--- also found ---\n" + "\n\n".join(problems))
        try:
            full_screenshot(page, tmp_path / "failure.png")
            print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
        except Exception:  # noqa: BLE001
            pass
        raise
    finally:
        page.close()


def test_enter_never_starts_an_audit_and_any_session_sees_and_cancels_the_one_job(tmp_path, browser):
    """What a newcomer met on New audit: Enter in a settings field (confirming a batch size) only
    commits the value; Start audit starts one job, a second Start of the same run while it runs is
    refused in one line; after a reload (a new session) the running job is listed with its Cancel,
    and the cancelled job then reads as one line saying who cancelled it and what is kept."""
    from hostile.hostile_helpers import make_series, write_texts_csv

    from gnq_core.jobs.jobs import list_jobs

    series = make_series(tmp_path / "series", 3, max_length=32)
    data = write_texts_csv(tmp_path / "texts.csv", 1200)  # minutes of audit: it is still running below
    db = tmp_path / "gnq.duckdb"
    shots = Path(os.environ.get("GNQ_SCREENSHOTS") or tmp_path / "shots")

    def jobs() -> list:
        return list_jobs(db) if (tmp_path / "jobs").exists() else []

    with serving(tmp_path, db) as server:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(f"{server.url}/new_audit")
            page.get_by_role("heading", name="New audit").first.wait_for(timeout=60_000)
            settle(page)
            for group, label, path in (("Checkpoints", "Checkpoint folder on this machine", series),
                                       ("Dataset", "Dataset file on this machine", data)):
                page.get_by_role("radiogroup", name=group, exact=True).get_by_text("Local path",
                                                                                   exact=True).click()
                settle(page)
                box = page.get_by_label(label, exact=True)
                box.fill(str(path))
                box.press("Enter")  # outside the form: Enter commits the path
                settle(page)
            wait_for_text_or_error(page, "3 checkpoint(s)", 30)
            set_form_value(page, "Run name", "enter-test")
            batch = page.get_by_label("Batch size", exact=True)
            batch.fill("3")
            batch.press("Enter")
            settle(page)
            page.wait_for_timeout(1500)
            assert jobs() == [], "Enter in Batch size started an audit"
            assert batch.input_value() == "3"

            page.get_by_role("button", name="Start audit").click()
            wait_for_text_or_error(page, "Started 'enter-test'", 60)
            page.get_by_role("button", name="Start audit").click()  # a second start, the same run
            page.get_by_text("Not started: run 'enter-test' is being written by the job started at").first \
                .wait_for(timeout=30_000)
            assert len(jobs()) == 1 and jobs()[0].status == "running"

            page.reload()  # a new session: nothing of the first one's state
            page.get_by_role("heading", name="New audit").first.wait_for(timeout=60_000)
            settle(page)
            page.get_by_role("button", name="Cancel").first.click()
            page.get_by_text("cancelled from the dashboard at").first.wait_for(timeout=120_000)
            settle(page)
            full_screenshot(page, shots / "13-new-audit-cancelled.png")
            (job,) = jobs()
            assert job.status == "cancelled" and job.returncode == 130, server.report()
            assert "what it finished is kept; starting it again resumes" in body_text(page)
        except BaseException:
            print(server.report())
            with contextlib.suppress(Exception):
                full_screenshot(page, tmp_path / "failure.png")
                print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
            raise
        finally:
            page.close()
