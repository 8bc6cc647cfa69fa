"""The settings of each job kind (train, audit, extract, demo; DESIGN.md §6), validated when built.

The CLI builds them from its options and the dashboard from its forms, so both refuse the same
values with the same one-line message, before anything is written.  A background job receives
them as JSON (``job_dict`` / ``job_from_dict``), never as a command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from gnq_core.attacks import defaults as attack
from gnq_core.common.values import finite as _finite
from gnq_core.common.values import require as _require
from gnq_core.common.values import whole as _whole

FULL_PRECISION = ("float32", "float64")
# An audit's --dtype: "auto" computes in the dtype the weights are stored in (a bf16 checkpoint in
# bf16, as trained, its Grams and solve in float32/float64: approximate, its error stated with the
# run); float32/float64 upcast them, by the user's choice.
DTYPE_AUTO = "auto"
AUDIT_DTYPES = (DTYPE_AUTO, "float32", "float64", "bfloat16", "float16")
COMPANIONS_ALL = "all"  # --companions all: every other text of the data
COMPANION_SOLVES = ("auto", "texts", "sketch")  # the cheaper; the held n × n path; the streamed m × m one


@dataclass(frozen=True)
class AuditSettings:
    """How GNQ is measured (also the part of ``TrainSettings`` that says it)."""

    dtypes: ClassVar[tuple[str, ...]] = AUDIT_DTYPES

    lam: float = 1e-2
    # None: the largest batch up to 16 whose memory plan fits (sources.memory_plan), chosen when the
    # audit starts and recorded with the run
    batch_size: int | None = None
    max_length: int = 128
    seed: int = 0
    device: str = "auto"
    dtype: str = DTYPE_AUTO
    loss: str = "token_mean"       # ℓ_j: the token mean or the token sum (engine/math/losses.py)
    lam_mode: str = "absolute"     # λ = lam, or "relative": lam · the batch's mean K_jj (math/solve.py)
    # post hoc only: GNQ of each text against N others of the data ("all": every other text) through
    # sketches (engine/sketch/companions.py); None: against the others of its batch, exactly
    companions: int | str | None = None
    sketch_k: int = 4096           # sketch dimensions per weight matrix (sketch/projection.py DEFAULT_K)
    sketch_vocab_rows: int = 1024  # buckets of a vocabulary-sized parameter's vocabulary side
    # m, the shared vector's dimensions; None: 16,384 against all the texts (an m × m system of
    # 2 GiB streams a training set), else 65,536 (pipelines/companions.py)
    sketch_total: int | None = None
    companions_solve: str = "auto"  # "auto": the cheaper; "texts": n × n; "sketch": streamed m × m

    def __post_init__(self) -> None:
        # here, not at the top: the CLI reads these types' defaults for its --help without torch
        from gnq_core.common.runtime import resolve_device, resolve_dtype
        from gnq_core.engine.math.conventions import check_lam_mode, check_loss_convention
        from gnq_core.results.records import check_gnq_settings

        if self.batch_size is not None:  # None: the memory plan's (sources/memory_plan.py)
            _whole(self.batch_size, "--batch-size", 2)  # first: a bad integer's message names its option
            check_gnq_settings(self.lam, self.batch_size)
        else:
            check_gnq_settings(self.lam, 2)
        _whole(self.seed, "--seed", 0)
        _whole(self.max_length, "--max-length", 2)
        check_loss_convention(self.loss), check_lam_mode(self.lam_mode)
        _require(self.dtype in self.dtypes, f"--dtype must be one of {', '.join(self.dtypes)}, got "
                                            f"{self.dtype!r}" + (" (auto: as the weights are stored)"
                                                                  if DTYPE_AUTO in self.dtypes else ""))
        resolve_device(self.device)  # the rule the run will use, now
        if self.dtype != DTYPE_AUTO:
            resolve_dtype(self.dtype)
        _whole(self.sketch_k, "--sketch-k", 1)
        _whole(self.sketch_vocab_rows, "the sketch's vocabulary rows", 1)
        if self.sketch_total is not None:
            _whole(self.sketch_total, "the sketch's total dimensions", 1)
        _require(self.companions_solve in COMPANION_SOLVES,
                 f"the companions' solve must be one of {', '.join(COMPANION_SOLVES)}, "
                 f"got {self.companions_solve!r}")
        if self.companions is not None and self.companions != COMPANIONS_ALL:
            _whole(self.companions, "--companions (or 'all')", 1)


@dataclass(frozen=True)
class TrainSettings(AuditSettings):
    dtypes: ClassVar[tuple[str, ...]] = FULL_PRECISION  # training keeps float32/float64 weights
    batch_size: int = 16  # type: ignore[assignment]  # in-run: the optimizer step's batch
    dtype: str = "float32"
    epochs: int = 3
    lr: float = 1e-3
    weight_decay: float = 0.0
    preset: str = "tiny"      # from scratch only
    vocab_size: int = 2048    # from scratch only

    def __post_init__(self) -> None:
        from gnq_core.sources.limits import BOUNDS
        from gnq_core.sources.models import PRESETS  # here: transformers is slow to import

        super().__post_init__()
        _require(self.companions is None, "--companions is post hoc: it applies to gnq audit, not training")
        _whole(self.epochs, "--epochs", 1)
        _finite(self.lr, "--lr"), _finite(self.weight_decay, "the weight decay")
        _require(self.preset in PRESETS, f"unknown model preset {self.preset!r} ({', '.join(PRESETS)})")
        vocab = next(b for b in BOUNDS if b.what == "vocabulary")  # the bound a checkpoint's config has
        _whole(self.vocab_size, "--vocab-size", 300, vocab.limit)


@dataclass(frozen=True, kw_only=True)
class _TextsJob:
    data: str  # the texts: .txt, .jsonl, .csv or .parquet
    name: str | None = None  # the run; default: the out / checkpoints folder's name
    text_column: str | None = None
    group_column: str | None = None
    secret_column: str | None = None  # each row's private value(s), found in its text
    secret_patterns: tuple[str, ...] = ()  # regexes of values to treat as secret (group 1: the value)
    public_column: str | None = None  # true: the text is public, nothing private in it
    threads: int | None = None  # torch CPU threads (the CLI's --threads); None: torch's choice
    # chat data (sources/chat.py): auto finds conversations by their columns; text: plain texts
    data_format: str = "auto"
    train_on: str | None = None  # all / assistant / completion; None: what TRL trains on for the format

    def __post_init__(self) -> None:
        from gnq_core.sources.chat import DATA_FORMATS, TRAIN_ON
        from gnq_core.sources.secrets import compile_patterns

        _require(self.threads is None or self.threads >= 1, f"--threads: at least 1, not {self.threads}")
        _require(self.data_format in DATA_FORMATS, f"--data-format must be one of {', '.join(DATA_FORMATS)}, "
                                                   f"not {self.data_format!r}")
        _require(self.train_on is None or self.train_on in TRAIN_ON,
                 f"--train-on must be one of {', '.join(TRAIN_ON)}, not {self.train_on!r}")
        _require(self.train_on is None or self.data_format != "text",
                 "--train-on applies to chat data: every token of a plain text is trained")
        object.__setattr__(self, "secret_patterns", tuple(self.secret_patterns or ()))
        compile_patterns(self.secret_patterns)


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
    non_members: str | None = None  # texts the model never saw, audited into NAME.non-members
    reference: str | None = None  # "first" or a model folder: reference loss of members and non-members
    tokenizer: str | None = None  # a folder with the tokenizer, for checkpoints saved without one
    base_model: str | None = None  # the checkpoints are PEFT adapters of this model (sources/adapters.py)
    merge_adapter: bool = False  # GNQ over all parameters of the merged model, not the adapter's
    shard_model: bool = False  # torchrun: each checkpoint sharded over the ranks (pipelines/sharding.py)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard_model:  # what the sharded path does not take, refused before anything runs
            from gnq_core.pipelines.sharding import check_shardable

            check_shardable(companions=self.settings.companions, adapters=self.base_model is not None)
        _require(not self.merge_adapter or self.base_model is not None,
                 "--merge-adapter applies to adapter checkpoints: give their base model with --base-model")
        _require(self.base_model is None or self.non_members is None,
                 "--non-members with --base-model (adapter checkpoints) is not supported yet: audit the "
                 "non-members as their own run with --base-model")


@dataclass(frozen=True)
class ExtractJob:
    """``gnq extract``: the calibrated prefix-completion attack on a stored run."""

    kind: ClassVar[str] = "extract"
    run: str
    checkpoint: str | None = None  # a point label; default: the last
    prefix_tokens: int = attack.DEFAULT_PREFIX
    threshold: float = attack.DEFAULT_THRESHOLD
    batch_size: int = attack.DEFAULT_ATTACK_BATCH
    device: str = "auto"
    suffix_tokens: int = attack.DEFAULT_SUFFIX  # exactly s tokens must follow (attacks/extraction.py)
    reference: str | None = attack.DEFAULT_REFERENCE  # "first", a model folder, or None: no calibration
    non_members: str | None = None  # texts never seen: audited over the run's checkpoints (audit runs)
    threads: int | None = None
    secret_candidates: int = attack.DEFAULT_SECRET_CANDIDATES  # N random values per secret for its exposure
    exposure_nodes: int = attack.DEFAULT_EXPOSURE_NODES  # the exact-rank search's budget per value

    def __post_init__(self) -> None:
        _require(self.threads is None or self.threads >= 1, f"--threads: at least 1, not {self.threads}")
        _whole(self.secret_candidates, "--secret-candidates", 1, attack.MAX_SECRET_CANDIDATES)
        _require(self.secret_candidates == 1 or self.secret_candidates >= attack.MIN_SECRET_CANDIDATES,
                 f"--secret-candidates must be 1 (no exposure) or at least {attack.MIN_SECRET_CANDIDATES} "
                 f"(fewer random values cannot rank a value), got {self.secret_candidates}")
        _whole(self.exposure_nodes, "--exposure-nodes", 1, attack.MAX_EXPOSURE_NODES)
        _whole(self.prefix_tokens, "--prefix-tokens", 1), _whole(self.suffix_tokens, "--suffix-tokens", 1)
        _whole(self.batch_size, "--batch-size", 1)
        _require(0.0 <= self.threshold <= 1.0, f"--threshold is a fraction in [0, 1], not {self.threshold}")
        from gnq_core.common.runtime import resolve_device

        resolve_device(self.device)


@dataclass(frozen=True)
class DemoJob:
    """``gnq demo``: train, audit and attack the demo model."""

    kind: ClassVar[str] = "demo"
    out: str | None = None
    epochs: int = 12
    device: str = "auto"
    model: str | None = None  # None: the tiny model from scratch; "smollm2": fine-tune the real model
    data: str | None = None  # the texts; None: data/demo.csv

    def __post_init__(self) -> None:
        _require(self.model in (None, "smollm2"), f"unknown demo model {self.model!r} (known: smollm2)")
        _require(self.epochs >= 2, f"the demo needs at least 2 epochs (a trajectory), got {self.epochs}")
        _whole(self.epochs, "--epochs", 2)
        from gnq_core.common.runtime import resolve_device

        resolve_device(self.device)


JobSettings = TrainJob | AuditJob | ExtractJob | DemoJob
JOB_KINDS: dict[str, type] = {cls.kind: cls for cls in (TrainJob, AuditJob, ExtractJob, DemoJob)}


def job_dict(job: JobSettings) -> dict[str, Any]:
    """The JSON-ready form of a job's settings (``kind`` names the type)."""
    return {"kind": job.kind} | asdict(job)


def job_from_dict(data: Any) -> JobSettings:
    """Settings from their JSON form, validated; ValueError with one line when they are not."""
    kind = data.get("kind") if isinstance(data, dict) else None
    _require(kind in JOB_KINDS, f"not job settings: kind must be one of {', '.join(JOB_KINDS)}, not {kind!r}")
    cls, values = JOB_KINDS[kind], {k: v for k, v in data.items() if k != "kind"}
    nested = getattr(cls.__dataclass_fields__.get("settings"), "default_factory", None)  # Train/AuditSettings
    try:
        if nested is not None and isinstance(values.get("settings"), dict):
            values["settings"] = nested(**values["settings"])
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{kind} settings: {exc}") from None
