"""What the studies share: where their data, checkpoints and reports live, the real-text corpora
from ../shared/data, dataset files written once and reused, and compute-time bookkeeping."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.progress import Reporter
from gnq_core.results.store import Store
from gnq_core.results.store_schema import StoreError
from gnq_core.sources.datasets import DatasetError, load_texts

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data"  # the project's convention: ../shared/data
TIMINGS = "timings.json"
SCALES = ("quick", "full", "paper", "real")  # real: a pretrained model on CPU (the studies that have it)


def studies_root(db: str | Path) -> Path:
    """The studies' checkpoints and intermediate files: studies/ beside the store (--work elsewhere)."""
    return Path(db).parent / "studies"


@dataclass(frozen=True)
class StudyContext:
    """Where a study reads and writes, and how it reports progress.

    ``work_root``/NAME holds checkpoints and intermediate files, ``reports_root``/NAME the report;
    NAME is the study's name, plus ``-quick`` in quick mode and ``-TAG`` with a tag.  Run names in
    the store are ``NAME.part`` (e.g. ``common-knowledge.finetune``).
    """

    store: Store
    quick: bool = False  # the same as scale="quick"
    scale: str = "full"  # quick (tests), full (the CPU study), paper (GPT-2 small at the paper's settings),
    # real (a pretrained model fine-tuned on CPU; common-knowledge only)
    seed: int = 0
    device: str = "auto"
    work_root: Path | None = None  # default: <store folder>/studies
    reports_root: Path = Path("reports")
    data_dir: Path | None = None  # default: ../shared/data next to the repository
    tag: str | None = None
    command: str = ""
    reporter_factory: Callable[[str], Reporter] | None = None  # JobProgress.reporter

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown study scale {self.scale!r} ({', '.join(SCALES)})")

    @property
    def preset(self) -> str:
        """The study's sizes: "quick", "full", "paper" or "real"."""
        return "quick" if self.quick else self.scale

    def pick(self, quick, full, paper):
        """The value of the study's scale (a study without a real scale refuses it in one line)."""
        if self.preset == "real":
            raise ValueError("--scale real exists for the common-knowledge study only so far")
        return {"quick": quick, "full": full, "paper": paper}[self.preset]

    def label(self, study: str) -> str:
        suffix = "" if self.preset == "full" else f"-{self.preset}"
        return study + suffix + (f"-{self.tag}" if self.tag else "")

    def work_dir(self, study: str) -> Path:
        root = self.work_root if self.work_root is not None else studies_root(self.store.path)
        path = Path(root) / self.label(study)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def report_dir(self, study: str) -> Path:
        path = Path(self.reports_root) / self.label(study)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def reporter(self, run_name: str) -> Reporter:
        """A progress reporter that also writes the run's progress to the store once it exists."""
        if self.reporter_factory is None:
            return Reporter()
        return self.reporter_factory(run_name)

    def shared_data(self) -> Path:
        """The real-text folder (WikiText-2, AG News), or one clear error naming it."""
        path = Path(self.data_dir) if self.data_dir is not None else DEFAULT_DATA_DIR
        if not (path / "ag_news" / "train_2000.csv").is_file():
            raise DatasetError(path, "shared data folder not found (expected ag_news/train_2000.csv and "
                                     "wikitext2/ under it); pass --data-dir")
        return path


@contextlib.contextmanager
def same_settings_or_tag() -> Iterator[None]:
    """A run that exists with other data or settings: point at --tag (the study's way to a new name)."""
    try:
        yield
    except StoreError as exc:
        if "exists with a different" not in str(exc):
            raise
        raise StoreError(str(exc).split("; use another")[0]
                         + "; pass --tag NAME to build the study under new names") from None


# ----------------------------------------------------------------------------------------- corpora
def clean(text: str) -> str:
    """One line of plain text: AG News's backslash line breaks and stray whitespace removed."""
    return " ".join(text.replace("\\", " ").split())


def ag_news(data_dir: Path, n: int | None = None) -> list[tuple[str, str]]:
    """(title. description, class name) rows of AG News: the 2,000-row train slice, then test."""
    classes = (data_dir / "ag_news" / "classes.txt").read_text(encoding="utf-8").split()
    rows: list[tuple[str, str]] = []
    for name in ("train_2000.csv", "test.csv"):
        path = data_dir / "ag_news" / name
        if not path.is_file():
            continue
        with path.open(newline="", encoding="utf-8") as f:
            for label, title, desc in csv.reader(f):
                rows.append((clean(f"{title}. {desc}"), classes[int(label) - 1]))
                if n is not None and len(rows) >= n:
                    return rows
    return rows


def wikitext_chunks(data_dir: Path, n: int, max_words: int) -> list[str]:
    """Up to n pieces of WikiText-2 (validation, then test) of whole sentences, each ≤ max_words
    words (a longer sentence is its own piece, cut at max_words); headings are skipped."""
    chunks: list[str] = []
    for name in ("wiki.valid.raw", "wiki.test.raw"):
        path = data_dir / "wikitext2" / name
        if not path.is_file():
            continue
        for paragraph in path.read_text(encoding="utf-8").splitlines():
            paragraph = paragraph.strip()
            if not paragraph or paragraph.startswith("="):
                continue
            # WikiText's tokenisation: " @,@ " inside numbers, spaces around punctuation.
            paragraph = re.sub(r" @(.)@ ", r"\1", paragraph)
            paragraph = re.sub(r" ([.,;:!?)'])", r"\1", paragraph).replace("( ", "(")
            current: list[str] = []
            for sentence in re.split(r"(?<=[.!?]) ", paragraph):
                words = sentence.split()
                if len(current) >= 5 and len(current) + len(words) > max_words:
                    chunks.append(" ".join(current))
                    current = []
                current += words
                if len(current) >= max_words:
                    chunks.append(" ".join(current[:max_words]))
                    current = []
            if len(current) >= 5:  # fragments (e.g. a lone "Adult H.") are dropped
                chunks.append(" ".join(current))
            if len(chunks) >= n:
                return chunks[:n]
    return chunks


def read_sentences(path: str | Path) -> list[str]:
    """The texts of a sentence file (.txt one per line, or .csv/.jsonl/.parquet with a text column)."""
    return [clean(t) for t in load_texts(path).texts]


def write_dataset(path: Path, texts: Sequence[str], groups: Sequence[str]) -> Path:
    """A text/group CSV, rewritten only when its content changes (so a rerun finds the same file
    and the same hash, and resumes)."""
    content = pd.DataFrame({"text": list(texts), "group": list(groups)}).to_csv(index=False)
    if not path.is_file() or path.read_text(encoding="utf-8") != content:
        write_text_atomic(path, content)
    return path


# ----------------------------------------------------------------------------------------- timing
class Timings:
    """Compute seconds per stage, summed over every invocation (a resumed stage adds its rest)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / TIMINGS
        saved = self.path.read_text(encoding="utf-8") if self.path.is_file() else "{}"
        self.data: dict[str, float] = json.loads(saved)
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.data[name] = self.data.get(name, 0.0) + time.perf_counter() - t0
            write_text_atomic(self.path, json.dumps(self.data, indent=2))

    @property
    def total(self) -> float:
        return sum(self.data.values())

    def this_invocation(self) -> float:
        return time.perf_counter() - self.started


def machine(device: str = "auto") -> str:
    """The machine in words; the GPU's name when the study ran on CUDA."""
    cpu = (f"{platform.machine()} CPU, {os.cpu_count()} cores visible, torch {torch.__version__}, "
           f"torch threads: {torch.get_num_threads()}")
    if device != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}); host: {cpu}"
    return cpu


# ----------------------------------------------------------------------------------------- attacks
def attack_last_point(ctx: StudyContext, run, prefix_tokens: int, threshold: float, timings: Timings,
                      suffix_tokens: int | None = None) -> pd.Series:
    """Prefix-completion attack (uncalibrated) on the run's last finished point, unless that attack
    (same p and threshold) is already stored; returns the point's row.  ``suffix_tokens``: the
    fixed-length rule of ``attacks.extraction`` (None: the rest of the text)."""
    from gnq_core.attacks.run import run_extraction

    points = ctx.store.points(run.run_id)
    done = points[points["status"] == "done"]
    if done.empty:
        raise StoreError(f"{ctx.store.path}: run {run.name!r} has no finished point to attack")
    row = done.iloc[-1]
    stored = ctx.store.extractions(run.run_id, int(row["point"]))
    stored = stored[stored["prefix_tokens"] == prefix_tokens]
    if stored.empty or not (stored["threshold"] == threshold).all():
        with timings.stage(f"attack (p={prefix_tokens})"), ctx.reporter(run.name) as r:
            run_extraction(ctx.store, run, checkpoint=str(row["label"]), prefix_tokens=prefix_tokens,
                           threshold=threshold, batch_size=64, device=ctx.device, reporter=r,
                           suffix_tokens=suffix_tokens, reference=None)
    return row


def attacked_totals(store: Store, run_id: int, point: int, prefix_tokens: int) -> pd.DataFrame:
    """``Store.example_totals`` with the extraction columns of one attack (point, p) — never a
    later attack with another prefix length — and the run's per-example metrics as columns."""
    totals = store.example_totals(run_id).drop(columns=["extraction_match", "extracted",
                                                        "extraction_generated"])
    attack = store.extractions(run_id, point)
    attack = attack[attack["prefix_tokens"] == prefix_tokens][
        ["example_id", "match_fraction", "success", "n_continuation", "generated_text"]].rename(
        columns={"match_fraction": "extraction_match", "success": "extracted",
                 "generated_text": "extraction_generated"})
    totals = totals.merge(attack, on="example_id", how="left")
    metrics = store.metrics(run_id)
    metrics = metrics.drop(columns=[c for c in metrics.columns if c != "example_id" and c in totals.columns])
    return totals.merge(metrics, on="example_id", how="left") if len(metrics.columns) > 1 else totals
