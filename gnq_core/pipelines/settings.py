"""The settings of each job kind (train, audit, extract, demo; DESIGN.md §6), validated when built.

The CLI builds them from its options and the dashboard from its forms, so both refuse the same
values with the same one-line message, before anything is written.  A background job receives
them as JSON (``job_dict`` / ``job_from_dict``), never as a command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from gnq_core.results.records import check_gnq_settings
from gnq_core.runtime import DTYPES


def _check_run(max_length: int, device: str, dtype: str) -> None:
    if max_length < 2:
        raise ValueError(f"--max-length must be at least 2 tokens, got {max_length}")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r} (use auto, cpu or cuda)")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (use one of {', '.join(DTYPES)})")


@dataclass(frozen=True)
class AuditSettings:
    lam: float = 1e-2
    batch_size: int = 16
    max_length: int = 128
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_gnq_settings(self.lam, self.batch_size)
        _check_run(self.max_length, self.device, self.dtype)


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 3
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.0
    lam: float = 1e-2
    max_length: int = 128
    seed: int = 0
    preset: str = "tiny"      # from scratch only
    vocab_size: int = 2048    # from scratch only
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_gnq_settings(self.lam, self.batch_size)
        _check_run(self.max_length, self.device, self.dtype)
        if self.epochs < 1:
            raise ValueError(f"--epochs must be at least 1, got {self.epochs}")
        if not (self.lr >= 0 and self.weight_decay >= 0):
            raise ValueError(f"the learning rate and weight decay must be ≥ 0, got {self.lr}, "
                             f"{self.weight_decay}")
        from gnq_core.sources.models import PRESETS  # here: transformers is slow to import

        if self.preset not in PRESETS:
            raise ValueError(f"unknown model preset {self.preset!r}; presets: {', '.join(sorted(PRESETS))}")
        if self.vocab_size < 300:  # the byte alphabet plus special tokens
            raise ValueError(f"--vocab-size must be at least 300, got {self.vocab_size}")


@dataclass(frozen=True, kw_only=True)
class _TextsJob:
    data: str  # the texts: .txt, .jsonl, .csv or .parquet
    name: str | None = None  # the run; default: the out / checkpoints folder's name
    text_column: str | None = None
    group_column: str | None = None


@dataclass(frozen=True, kw_only=True)
class TrainJob(_TextsJob):
    """``gnq train``: train or fine-tune with in-run GNQ."""

    kind: ClassVar[str] = "train"
    out: str
    init: str | None = None  # a checkpoint to fine-tune; None: from scratch
    settings: TrainSettings = field(default_factory=TrainSettings)


@dataclass(frozen=True, kw_only=True)
class AuditJob(_TextsJob):
    """``gnq audit``: GNQ of every text at every checkpoint under ``checkpoints``."""

    kind: ClassVar[str] = "audit"
    checkpoints: str
    settings: AuditSettings = field(default_factory=AuditSettings)


@dataclass(frozen=True)
class ExtractJob:
    """``gnq extract``: the prefix-completion attack on a stored run."""

    kind: ClassVar[str] = "extract"
    run: str
    checkpoint: str | None = None  # a point label; default: the last
    prefix_tokens: int = 12
    threshold: float = 1.0
    batch_size: int = 32
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.prefix_tokens < 1 or self.batch_size < 1:
            raise ValueError("--prefix-tokens and --batch-size must be at least 1")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"--threshold is a match fraction in [0, 1], got {self.threshold}")


@dataclass(frozen=True)
class DemoJob:
    """``gnq demo``: train, audit and attack the demo model."""

    kind: ClassVar[str] = "demo"
    out: str | None = None
    epochs: int = 12
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.epochs < 2:
            raise ValueError(f"the demo needs at least 2 epochs (a trajectory), got {self.epochs}")


JobSettings = TrainJob | AuditJob | ExtractJob | DemoJob
JOB_KINDS: dict[str, type] = {cls.kind: cls for cls in (TrainJob, AuditJob, ExtractJob, DemoJob)}


def job_dict(job: JobSettings) -> dict[str, Any]:
    """The JSON-ready form of a job's settings (``kind`` names the type)."""
    return {"kind": job.kind} | asdict(job)


def job_from_dict(data: Any) -> JobSettings:
    """Settings from their JSON form, validated; ValueError with one line when they are not."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in JOB_KINDS:
        raise ValueError(f"not job settings: kind must be one of {', '.join(JOB_KINDS)}, got {kind!r}")
    cls = JOB_KINDS[kind]
    values = {k: v for k, v in data.items() if k != "kind"}
    nested = {f.name: f.default_factory for f in fields(cls) if f.name == "settings"}
    try:
        if nested and isinstance(values.get("settings"), dict):
            values["settings"] = nested["settings"](**values["settings"])
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{kind} settings: {exc}") from None
