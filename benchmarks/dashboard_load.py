"""Load test: concurrent dashboard sessions browsing a run of a million score rows while a job
writes to the same store (issue 20).  A real `streamlit run` on 127.0.0.1 only; each session is
its own headless chromium (playwright) in its own process; bounded loops.

    PYTHONPATH=$PWD python -m benchmarks.dashboard_load --sessions 3 --loops 2

Page time: from navigation until the page's heading is visible and the app is idle.  A lock
error is any page showing the store as busy/locked or an exception.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"": "Runs", "trajectories": "Trajectories", "flagged": "Flagged texts", "groups": "Groups",
         "drilldown": "Text drill-down"}
CHROMIUM = "/usr/bin/chromium"
LOCK_WORDS = ("lock", "busy", "another process", "Traceback")


def build_store(db: Path, examples: int, points: int) -> None:
    from gnq_core.results.store import Store

    store = Store(db)
    frame = pd.DataFrame({"example_id": range(examples), "text": [f"text {i}" for i in range(examples)],
                          "grp": [f"g{i % 5}" for i in range(examples)], "n_tokens": 8})
    run = store.create_run(name="million", kind="audit", lam=0.01, batch_size=16, seed=0, max_length=16,
                           model_path="m", dataset_path="d", dataset_hash="h", n_examples=examples,
                           code_version="bench", device="cpu", dtype="float32", examples=frame)
    store.add_points(run.run_id, [dict(point=p, label=f"epoch-{p + 1}", kind="checkpoint")
                                  for p in range(points)])
    rng = np.random.default_rng(0)
    for p in range(points):
        scores = pd.DataFrame({"example_id": np.arange(examples), "batch_index": np.arange(examples) // 16,
                               "step": pd.array([None] * examples, dtype="Int64"),
                               "gnq": rng.random(examples), "loss": rng.random(examples),
                               "self_influence": rng.random(examples)})
        nb = (examples + 15) // 16
        batches = pd.DataFrame({"batch_index": np.arange(nb), "step": pd.array([None] * nb, dtype="Int64"),
                                "size": 16, "condition": 1.0, "finite": True, "seconds": 0.1})
        store.write_point(run.run_id, p, scores, batches, 1.0)
    store.set_status(run.run_id, "done")


def writer(db: Path, seconds: float) -> None:
    """A job writing to the same store: progress and a point of 2,000 rows, over and over."""
    from gnq_core.results.store import Store

    store = Store(db)
    run = store.create_run(name="writer", kind="audit", lam=0.01, batch_size=16, seed=0, max_length=16,
                           model_path="m", dataset_path="d", dataset_hash="h", n_examples=2000,
                           code_version="bench", device="cpu", dtype="float32")
    store.add_points(run.run_id, [dict(point=0, label="c", kind="checkpoint")])
    n, end, k = 2000, time.monotonic() + seconds, 0
    while time.monotonic() < end:
        store.set_progress(run.run_id, k, 10**6, "writing")
        scores = pd.DataFrame({"example_id": np.arange(n), "batch_index": 0, "step": pd.array([None] * n,
                               dtype="Int64"), "gnq": np.random.rand(n), "loss": 1.0, "self_influence": 1.0})
        batches = pd.DataFrame({"batch_index": [0], "step": pd.array([None], dtype="Int64"), "size": [n],
                                "condition": [1.0], "finite": [True], "seconds": [0.1]})
        store.write_point(run.run_id, 0, scores, batches, 0.1)
        k += 1
        time.sleep(0.2)


def session(url: str, loops: int, out: multiprocessing.Queue) -> None:
    from playwright.sync_api import sync_playwright

    times, errors = [], 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page()
        for _ in range(loops):
            for path, heading in PAGES.items():
                t0 = time.perf_counter()
                page.goto(f"{url}/{path}")
                page.get_by_role("heading", name=heading).first.wait_for(timeout=180_000)
                page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]',
                                       timeout=180_000)
                times.append(time.perf_counter() - t0)
                body = page.inner_text("body")
                errors += any(w.lower() in body.lower() for w in LOCK_WORDS)
        browser.close()
    out.put((times, errors))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--loops", type=int, default=2)
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "load.duckdb"
        t0 = time.perf_counter()
        build_store(db, args.examples, args.points)
        build_s = time.perf_counter() - t0
        port = free_port()
        env = {**os.environ, "GNQ_DB": str(db), "PYTHONPATH": str(ROOT)}
        server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port",
                                   str(port), "--server.headless", "true", "--server.address", "127.0.0.1",
                                   "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        job = multiprocessing.Process(target=writer, args=(db, 3600.0))
        try:
            time.sleep(8)
            job.start()
            queue: multiprocessing.Queue = multiprocessing.Queue()
            workers = [multiprocessing.Process(target=session, args=(f"http://127.0.0.1:{port}", args.loops,
                                                                      queue)) for _ in range(args.sessions)]
            for w in workers:
                w.start()
            results = [queue.get(timeout=3600) for _ in workers]
            for w in workers:
                w.join()
        finally:
            job.terminate()
            job.join()
            server.terminate()
            server.wait()
    times = [t for r in results for t in r[0]]
    payload = {"sessions": args.sessions, "pages_per_session": args.loops * len(PAGES),
               "score_rows": args.examples * args.points, "build_store_s": round(build_s, 1),
               "page_s": {"n": len(times), "median": round(float(np.median(times)), 2),
                          "p95": round(float(np.percentile(times, 95)), 2), "max": round(max(times), 2)},
               "lock_errors": sum(r[1] for r in results),
               "writer": "one process writing progress and a 2,000-row point every ~0.2 s to the same store"}
    print(payload)
    print(write("dashboard_load", payload))


if __name__ == "__main__":
    main()
