"""How long an audit will take, estimated before it starts from measured throughput.

The constants are the measurements of docs/performance.md of `gnq audit` and `gnq extract`
(``python -m benchmarks.cli_throughput``, ``benchmarks/results/cli_throughput-cpu.json``: 512 AG
News texts, GPT-2 presets tiny and small, a 2-core x86_64 CPU at 2 torch threads). Time per text
is modelled as a fixed cost plus parameters × tokens over a rate; the two presets give the two
unknowns, so the model reproduces both measurements and scales to other sizes from them. A
forward and backward pass costs about 6 × parameters × tokens, so the scaling is right to first
order; it ignores memory traffic, attention's quadratic term and the machine's load.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnq_core.attacks.defaults import DEFAULT_PREFIX, DEFAULT_SUFFIX


@dataclass(frozen=True)
class Measured:
    """One benchmark row: a model of `parameters`, texts of `tokens` tokens, `per_s` texts a second."""

    preset: str
    parameters: int
    tokens: float
    per_s: float


# gnq audit, B=16, T <= 128: examples/s per checkpoint; 67.4 tokens a text on average (the
# benchmark's own 4,096-entry tokenizer, texts cut at 128)
AUDIT_MEASURED = (Measured("tiny", 370_432, 67.4, 129.3), Measured("small", 4_240_896, 67.4, 36.6))
# gnq extract, p = 12, s = 8, batch 32: texts attacked a second (prefix + suffix tokens each)
EXTRACT_MEASURED = (Measured("tiny", 370_432, DEFAULT_PREFIX + DEFAULT_SUFFIX, 198.1),
                    Measured("small", 4_240_896, DEFAULT_PREFIX + DEFAULT_SUFFIX, 75.8))
STARTUP_S = 2.1  # imports, once per stage
CHARS_PER_TOKEN = 4.0  # English text in a subword vocabulary, for a text whose tokens are not counted yet
BENCH_THREADS = 2
BENCH_MACHINE = f"a 2-core x86_64 CPU at {BENCH_THREADS} threads, nothing else running"


@dataclass(frozen=True)
class Rate:
    """Seconds per text = ``fixed_s`` + parameters × tokens / ``per_s``."""

    fixed_s: float
    per_s: float

    def seconds(self, parameters: int, tokens: float, threads: int = BENCH_THREADS) -> float:
        """Seconds per text; the parameters × tokens term scaled to `threads` as if every core were
        as fast as the benchmark's and the work split evenly (optimistic beyond a few threads)."""
        return self.fixed_s + parameters * tokens / self.per_s * BENCH_THREADS / threads


def fit(rows: tuple[Measured, Measured]) -> Rate:
    """The line through two measurements (seconds per text against parameters × tokens)."""
    (w1, t1), (w2, t2) = ((r.parameters * r.tokens, 1.0 / r.per_s) for r in rows)
    if w1 == w2 or t2 <= t1:
        raise ValueError("the two measurements must differ in work and in time")
    per_s = (w2 - w1) / (t2 - t1)
    return Rate(fixed_s=max(0.0, t1 - w1 / per_s), per_s=per_s)


@dataclass(frozen=True)
class Estimate:
    """Estimated seconds of the audit (every checkpoint) and of the attack (0 without it)."""

    audit_s: float
    attack_s: float
    basis: str

    @property
    def total_s(self) -> float:
        return self.audit_s + self.attack_s


def duration(seconds: float) -> str:
    """42 s, 3 min 05 s, 1 h 02 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _count(n: int) -> str:
    """135.0M, 1.7B, 370,432."""
    return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M" if n >= 1e6 else f"{n:,}"


def tokens_per_text(mean_chars: float, max_length: int) -> float:
    """Tokens GNQ reads of an average text: its characters over CHARS_PER_TOKEN, at most max_length."""
    return float(min(max_length, max(1.0, mean_chars / CHARS_PER_TOKEN)))


def estimate_audit(*, parameters: int, texts: int, checkpoints: int, tokens: float, attack: bool = False,
                   prefix: int = DEFAULT_PREFIX, suffix: int = DEFAULT_SUFFIX,
                   threads: int = BENCH_THREADS) -> Estimate:
    """Estimated time of an audit of `checkpoints` checkpoints of a `parameters`-parameter model on
    `texts` texts of `tokens` tokens each (see tokens_per_text), plus the extraction attack (on the
    last checkpoint, its reference scored too) when `attack`: measured throughput scaled by
    parameters × tokens, at `threads` torch threads. The secret-value stage is not in it."""
    if min(parameters, texts, checkpoints) < 0 or tokens < 0 or threads < 1:
        raise ValueError("parameters, texts, checkpoints and tokens must not be negative, threads at least 1")
    audit_s = STARTUP_S + texts * checkpoints * fit(AUDIT_MEASURED).seconds(parameters, tokens, threads)
    attack_s = 0.0
    if attack:
        attack_s = STARTUP_S + texts * fit(EXTRACT_MEASURED).seconds(parameters, prefix + suffix, threads)
    small = AUDIT_MEASURED[-1]
    basis = (f"{_count(parameters)} parameters × ≈{tokens:.0f} tokens a text × {texts:,} texts × "
             f"{checkpoints} checkpoint(s) at {threads} thread(s), scaled from `gnq audit` measured at "
             f"{small.per_s:g} texts/s per checkpoint on {small.parameters / 1e6:.1f}M parameters × "
             f"{small.tokens:g} tokens (docs/performance.md; {BENCH_MACHINE}); a busy machine is slower"
             + ("; the attack scaled from `gnq extract`" if attack else "")
             + "; secret-value probing not included")
    return Estimate(audit_s=audit_s, attack_s=attack_s, basis=basis)
