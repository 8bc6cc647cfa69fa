"""Post-hoc GNQ against a companion set (``gnq audit --companions N|all``; DESIGN.md §9).

The texts are cut into seeded companion sets of N + 1 texts (copies of a text in different sets
whenever the data allow it, as for batches; ``all``: one set of every text).  For each set, one
pass in micro-batches of ``batch_size`` reduces every text's gradient to its sketch
(``WindowAuditor`` in sketch mode: output gradients only, no weight gradients), and GNQ of each
text against the set's other texts comes from the sketches (``engine.sketch.companions``).  The set is
the rows' GNQ batch: its ``batches`` row has gnq_mode 'companions', size N + 1 (each text is
measured against size − 1 others), sketch_k and sketch_seed.

A set the held n × n path would need more memory for than one m × m matrix (a training set:
``all``) is streamed instead: a first pass adds each micro-batch's sketches into A = SᵀS and lets
them go, A + λI is factored once, and a second pass recomputes each text's sketch and its GNQ
(``engine.sketch.companions.SketchSystem``).  A is saved beside the store after the first pass, keyed by
what it was formed from (the store, the run, the checkpoint's digest, the texts' digest, the
settings) and by a digest of A itself; a rerun that finds it and where every key matches skips that
pass.  Another store's file in the same folder, one whose texts or checkpoint changed, a truncated or
altered one: the pass runs again and the log says why.  A full disk while saving loses only the
resumption (the log says so).  Under torchrun every rank adds its
share of the texts and A is all-reduced; each rank then scores its share and the lead writes.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnq_core.attacks.membership import TOKEN_SIGNALS, token_signals
from gnq_core.common.atomic import atomic_path
from gnq_core.common.progress import Reporter
from gnq_core.common.runtime import code_version, release_freed_memory
from gnq_core.engine.math.losses import lm_target_counts, per_example_lm_loss
from gnq_core.engine.math.solve import GNQNumericalError
from gnq_core.engine.passes.window import WindowAuditor
from gnq_core.engine.plan.plan_reuse import PlanCache
from gnq_core.engine.sketch.companions import (
    SketchFactor,
    SketchRows,
    SketchSystem,
    companion_gnq,
    held_bytes,
    streamed_bytes,
)
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.pipelines.companion_plan import sketch_spec
from gnq_core.pipelines.options import companion_set_size
from gnq_core.pipelines.ranks import Ranks
from gnq_core.pipelines.scoring import Scores, score_batch
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.records import MIN_BATCH_SIZE, BatchResult, ScoreColumns
from gnq_core.sources.tokens import LMBatch, Partition, seeded_partition, stream_batches

COMPANIONS_MODE = "companions"  # batches.gnq_mode of a companion set


def companion_sets(n_texts: int, settings: AuditSettings, clusters: Sequence[int] | np.ndarray | None = None
                   ) -> Partition:
    """The seeded companion sets of an audit with ``settings.companions``: N + 1 texts each (the
    last the remainder), or one set of every text."""
    size = companion_set_size(settings, n_texts)
    if size is None:
        raise ValueError("companion_sets needs settings.companions")
    return seeded_partition(n_texts, max(size, 1), settings.seed, clusters)


def choose_solve(n: int, spec: SketchSpec, settings: AuditSettings, ranks: Ranks) -> tuple[str, str]:
    """"texts" (hold the n sketches, solve n × n) or "sketch" (stream the m × m system), and why.
    Streamed when it needs less memory, and always across ranks (each holds only its share)."""
    m = spec.shared
    if settings.companions_solve != "auto" or m is None:  # side by side: m is known only once sketched
        solve = "texts" if m is None else settings.companions_solve
        return solve, f"{solve} as asked" if m is not None else "texts: the sketch is not folded (m unknown)"
    held, streamed = held_bytes(n, m), streamed_bytes(m)
    if ranks.world > 1:
        return "sketch", f"sketch: {ranks.world} ranks share the texts ({streamed / 2**30:.2f} GiB each)"
    if held <= streamed:
        return "texts", (f"texts: {n:,} texts × m = {m:,} held and an n × n solve, {held / 2**30:.2f} GiB, "
                         f"no more than the streamed m × m system's {streamed / 2**30:.2f} GiB")
    return "sketch", (f"sketch: the m × m system streamed in two passes, {streamed / 2**30:.2f} GiB whatever "
                      f"n, where holding {n:,} texts' sketches and an n × n solve would take "
                      f"{held / 2**30:.2f} GiB")


def _micro_batches(texts: list[int], batch_size: int) -> Partition:
    n = len(texts)
    return Partition(np.asarray(texts, dtype=np.int64),
                     np.append(np.arange(0, n, batch_size, dtype=np.int64), n))


def audit_companions(model: torch.nn.Module, tokenizer, texts: Sequence[str], sets: Partition,
                     indices: Sequence[int], settings: AuditSettings, device: torch.device,
                     reporter: Reporter | None = None, *, trainable_only: bool = False,
                     ranks: Ranks | None = None, saved: Path | None = None, checkpoint: str = "",
                     plans: PlanCache | None = None, key: dict[str, Any] | None = None
                     ) -> tuple[ScoreColumns, list[BatchResult]]:
    """GNQ, loss, sketched self-influence and the forward signals of every text of the companion
    sets ``indices`` at the model's current weights; one ``BatchResult`` per set.

    Each set takes the cheaper solve (``choose_solve``; logged).  Streamed: ``saved`` is where the
    first pass's A is kept until the set is scored (a rerun that finds it, formed from the same
    ``checkpoint``, texts and sketch and under the same ``key`` (the caller's identity of the store,
    run and checkpoint digest), skips that pass); under ``ranks`` every rank calls this with
    the same sets, and the lead gets the rows (the others get none).  ``plans``: as for
    ``audit.audit_batches``."""
    spec = sketch_spec(settings)
    ranks = ranks or Ranks()
    capacity = sum(sets.size(k) for k in indices)
    columns, results = ScoreColumns(capacity if ranks.lead else 0, TOKEN_SIGNALS), []
    model.eval()
    if not trainable_only:
        for p in model.parameters():
            p.requires_grad_(True)
    dtype = next(model.parameters()).dtype
    hold = torch.float64 if dtype == torch.float64 else torch.float32  # the sketches as computed
    reporter = reporter or Reporter()
    with WindowAuditor(model, lam=settings.lam, mode="sketch", sketch=spec, keep_exact=False) as auditor:
        if plans is not None:
            auditor.reuse_plans(plans)
        passes = _Passes(model, auditor, tokenizer, texts, settings, device, hold, reporter)
        for index in indices:
            t0 = time.perf_counter()
            members = sets.batch(index)
            solve, why = choose_solve(len(members), spec, settings, ranks)
            if solve == "sketch" and len(members) >= MIN_BATCH_SIZE:
                reporter.log(f"companion set of {len(members):,} texts: {why}")
                found = _streamed(passes, members, spec, settings, ranks, saved, checkpoint, t0, int(index),
                                  key or {})
                if found is not None:
                    columns.add(found[0])
                    results.append(found[1])
                continue
            if ranks.world > 1:
                raise ValueError("--companions N runs in one process: run it without torchrun "
                                 "(--companions all runs under torchrun)")
            if len(members) > 1000:  # a training set's choice is worth a line; a small set's is not
                reporter.log(f"companion set of {len(members):,} texts: {why}")
            losses, targets, extra = [], [], {}
            held = SketchRows(len(members))
            for rows, widths, loss, target, signals in passes.run(members):
                held.put(rows, widths)  # the micro-batch's parts are let go now
                losses.append(loss)
                targets.append(target)
                for name, values in signals.items():
                    extra.setdefault(name, []).append(values)

            def solve_held(n: int = len(members), rows: SketchRows = held) -> Scores:
                if n < MIN_BATCH_SIZE:  # a set of one text has no companions: NULL GNQ, K_jj kept
                    S = rows.take().to(torch.float64)
                    return None, (S * S).sum(dim=1), None, n
                # the sketches go straight in: the n × n path frees them once their Gram exists
                release_freed_memory()  # and the pass's freed heap goes before the Gram's n × n
                sol = companion_gnq(rows.take(), settings.lam, settings.lam_mode)
                return sol.gnq, sol.self_influence, sol.condition, n

            rows, result = score_batch(solve_held, torch.cat(losses), members, targets=torch.cat(targets),
                                       batch_index=int(index), step=None, started=t0,
                                       extra={name: np.concatenate(parts) for name, parts in extra.items()},
                                       gnq_mode=COMPANIONS_MODE, sketch_k=spec.k, sketch_seed=spec.seed)
            columns.add(rows)
            results.append(result)
    return columns, results


class _Passes:
    """One pass over some texts in micro-batches of ``batch_size``: each text's sketch, loss,
    number of targets and forward signals, a micro-batch at a time."""

    def __init__(self, model: torch.nn.Module, auditor: WindowAuditor, tokenizer, texts: Sequence[str],
                 settings: AuditSettings, device: torch.device, hold: torch.dtype,
                 reporter: Reporter) -> None:
        self.model, self.auditor, self.tokenizer, self.texts = model, auditor, tokenizer, texts
        self.settings, self.device, self.hold, self.reporter = settings, device, hold, reporter

    def run(self, members: list[int], signals: bool = True
            ) -> Iterator[tuple[torch.Tensor | None, dict[str, int], torch.Tensor, torch.Tensor, dict]]:
        """(sketches [b, m] or None for a micro-batch whose loss or gradient is not finite, their
        widths, losses, targets, signals) of each micro-batch of ``members``, in order."""
        micro = _micro_batches(members, self.settings.batch_size)
        for batch in stream_batches(self.tokenizer, self.texts, micro, range(len(micro)),
                                    self.settings.max_length):
            b: LMBatch = batch.to(self.device)
            logits = self.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            loss = per_example_lm_loss(logits, b.labels, self.settings.loss)
            self.auditor.backward(loss.sum())  # output gradients only
            self.auditor.add_micro_batch()
            try:
                rows: torch.Tensor | None = self.auditor.take_sketches(self.hold)
            except GNQNumericalError:
                rows = None
            self.model.zero_grad(set_to_none=True)
            yield (rows, self.auditor.sketcher.widths(), loss.detach(), lm_target_counts(b.labels),
                   token_signals(logits, b.labels) if signals else {})
            self.reporter.advance(len(batch.example_ids))


def _streamed(passes: _Passes, members: list[int], spec: SketchSpec, settings: AuditSettings, ranks: Ranks,
              saved: Path | None, checkpoint: str, t0: float, index: int, key: dict[str, Any]
              ) -> tuple[ScoreColumns, BatchResult] | None:
    """One companion set by the streamed m × m system (two passes); the lead's rows, None elsewhere."""
    m = spec.shared
    assert m is not None
    n = len(members)
    share = members[ranks.rank * n // ranks.world:(ranks.rank + 1) * n // ranks.world]  # in order
    provenance = (_provenance(passes.model, checkpoint, members, passes.texts, spec, settings) | key
                  if ranks.lead else None)
    system = _saved_system(saved, provenance, m, ranks, passes.reporter)
    if system is None:  # pass 1: A = SᵀS, each rank over its share
        passes.reporter.stage(f"{checkpoint or 'companions'}: pass 1 of 2, the m × m system", len(share))
        system, finite = SketchSystem(m, passes.device), True
        for k, (rows, _, _, _, _) in enumerate(passes.run(share, signals=False)):
            if rows is None:
                finite = False
            else:
                system.add(rows)
            _trim_now(k, settings.batch_size)
        if not finite:  # a NaN poisons A on every rank alike
            system.A.fill_(float("nan"))
        if ranks.world > 1:
            system.all_reduce()
        if ranks.lead and saved is not None:
            _save_system(saved, system, provenance, passes.reporter)
    lam = system.lam(settings.lam, settings.lam_mode)
    factor: SketchFactor | None
    try:
        factor = system.factor(lam)
    except GNQNumericalError:
        factor = None
    del system
    release_freed_memory()
    # pass 2: each text's sketch again, its GNQ and K_jj; losses and signals from the same forward
    passes.reporter.stage(f"{checkpoint or 'companions'}: pass 2 of 2, each text's GNQ", len(share))
    gnq, kjj, losses, targets, extra = [], [], [], [], {}
    waiting: list[torch.Tensor] = []

    def score_waiting() -> None:  # one triangular solve for many rows: L is read once for them
        if waiting and factor is not None:
            S = torch.cat(waiting).to(torch.float64)
            gnq.append(factor.gnq(S).cpu())
            kjj.append((S * S).sum(dim=1).cpu())
        waiting.clear()

    for k, (rows, _, loss, target, signals) in enumerate(passes.run(share)):
        _trim_now(k, settings.batch_size)
        if rows is not None and factor is not None:
            waiting.append(rows)
            if sum(len(w) for w in waiting) >= SketchSystem.FLUSH_ROWS:
                score_waiting()
        losses.append(loss.cpu())
        targets.append(target.cpu())
        for name, values in signals.items():
            extra.setdefault(name, []).append(values)
    score_waiting()
    finite = factor is not None and sum(len(g) for g in gnq) == len(share)
    mine = (finite, _cat(gnq), _cat(kjj), _cat(losses), _cat(targets),
            {name: np.concatenate(parts) for name, parts in extra.items()})
    parts = ranks.gather(mine)
    if not ranks.lead:
        return None
    if saved is not None:
        saved.unlink(missing_ok=True)  # the set is scored: its A is no longer needed
    every = all(p[0] for p in parts)
    condition = factor.condition if factor is not None else None

    def solve() -> Scores:
        if not every:
            raise GNQNumericalError("the sketches have NaN/Inf entries (non-finite loss or gradient)")
        return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts]), condition, n

    return score_batch(solve, torch.cat([p[3] for p in parts]), members,
                       targets=torch.cat([p[4] for p in parts]),
                       batch_index=index, step=None, started=t0,
                       extra={name: np.concatenate([p[5][name] for p in parts]) for name in parts[0][5]},
                       gnq_mode=COMPANIONS_MODE, sketch_k=spec.k, sketch_seed=spec.seed)


def _trim_now(micro_batch: int, batch_size: int) -> None:
    """Hand the heap's freed pages back every ``FLUSH_ROWS`` texts: the passes free each micro-batch's
    large tensors between the small ones they keep (losses, signals), and glibc would keep those
    pages, growing the peak with n (≈ 190 KB a text measured) where it must not grow."""
    if (micro_batch + 1) % max(1, SketchSystem.FLUSH_ROWS // batch_size) == 0:
        release_freed_memory()


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def texts_digest(texts: Sequence[str], members: Sequence[int]) -> str:
    """sha256 of the ``members``' texts in order, each as its length and its UTF-8 bytes: two
    datasets of as many texts are told apart by what they say, not by how many they are."""
    digest = hashlib.sha256()
    for j in members:
        data = str(texts[j]).encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _matrix_digest(A: torch.Tensor) -> str:
    """sha256 of A's bytes (read in place): a saved A altered or cut short is told from the one saved."""
    array = A.detach().cpu().contiguous().numpy()
    return hashlib.sha256(memoryview(array).cast("B")).hexdigest()


def _provenance(model: torch.nn.Module, checkpoint: str, members: list[int], texts: Sequence[str],
                spec: SketchSpec, settings: AuditSettings) -> dict[str, Any]:
    """What a saved A was formed from: a rerun reuses it only when all of it is the same.  The
    weights enter by two sums (a checkpoint rewritten at the same path is not mistaken for it),
    the texts by their digest (another dataset of as many texts is not mistaken for them)."""
    with torch.no_grad():
        weights = [float(sum(p.double().sum() for p in model.parameters())),
                   float(sum(p.double().abs().sum() for p in model.parameters()))]
    return {"what": "A = sum of s_j s_j^T over a companion set's sketches", "checkpoint": checkpoint,
            "weights": weights, "texts": len(members),
            "members_crc32": zlib.crc32(np.asarray(members, dtype=np.int64).tobytes()),
            "texts_sha256": texts_digest(texts, members),
            "sketch": spec.describe(), "m": spec.shared, "loss": settings.loss,
            "max_length": settings.max_length, "batch_size": settings.batch_size, "dtype": settings.dtype,
            "code_version": code_version()}


# How a provenance's keys read in the line that says why a saved A is not used.
_KEY_WORDS = {"store": "store", "run": "run", "model_hash": "checkpoint digest", "checkpoint": "checkpoint",
              "weights": "weights", "texts_sha256": "texts", "members_crc32": "texts", "texts": "texts"}


def _mismatch(kept: Any, provenance: dict[str, Any], m: int) -> str | None:
    """Why a loaded file is not the first pass of ``provenance`` (None: it is), in words."""
    if not isinstance(kept, dict) or not isinstance(kept.get("provenance"), dict):
        return "it is not a saved first pass"
    A = kept.get("A")
    if not isinstance(A, torch.Tensor) or A.shape != (m, m) or not isinstance(kept.get("n"), int):
        return "its matrix is not the m × m system of this sketch"
    wanted, found = json.loads(json.dumps(provenance)), kept["provenance"]
    differ = [k for k in dict.fromkeys([*wanted, *found]) if wanted.get(k) != found.get(k)]
    if differ:
        words = list(dict.fromkeys(_KEY_WORDS.get(k, "settings") for k in differ))
        return f"it was formed for another audit (its {', '.join(words)} differ from this one's)"
    if kept.get("A_sha256") != _matrix_digest(A):
        return "it was altered after it was saved (its digest differs)"
    return None


def _saved_system(saved: Path | None, provenance: dict[str, Any] | None, m: int, ranks: Ranks,
                  reporter: Reporter | None = None) -> SketchSystem | None:
    """The lead's saved A when it was formed from the same ``provenance`` and is the matrix that
    was saved (every rank gets it), else None (pass 1 runs; the log says why a file found there
    is not used)."""
    system = None
    if ranks.lead and saved is not None and saved.is_file():
        try:
            kept = torch.load(saved, weights_only=True, map_location="cpu")  # never unpickles code
        except Exception as exc:  # noqa: BLE001 (cut short, not a torch file, code inside: never used)
            why = f"it cannot be read ({type(exc).__name__}: truncated or not a saved first pass)"
        else:
            why = _mismatch(kept, provenance or {}, m)
            if why is None:
                system = SketchSystem(m, A=kept["A"], n=int(kept["n"]))
        if why is not None and reporter is not None:
            reporter.log(f"{saved}: the saved first pass of this companion set is not used: {why}; "
                         "pass 1 runs again")
    found = ranks.broadcast(None if system is None else system.n)
    if found is None:
        return None
    if ranks.world > 1:  # every rank factors the same A (sent over gloo, on the CPU)
        import torch.distributed as dist

        if system is None:
            system = SketchSystem(m, n=found)
        dist.broadcast(system.A, src=0)
    return system


def _save_system(path: Path, system: SketchSystem, provenance: dict[str, Any] | None,
                 reporter: Reporter | None = None) -> None:
    """A, its digest and its provenance, written whole or not at all.  Saving only serves a rerun:
    a disk that is full (or any write error) loses that, never the audit; the log says so."""
    record = {"provenance": json.loads(json.dumps(provenance)), "A": system.A, "n": system.n,
              "A_sha256": _matrix_digest(system.A)}
    try:
        with atomic_path(path) as tmp:
            torch.save(record, tmp)
    except (OSError, RuntimeError) as exc:  # torch's writer reports a short write as RuntimeError
        path.unlink(missing_ok=True)
        if reporter is not None:
            why = getattr(exc, "strerror", None) or exc
            reporter.log(f"{path}: the first pass could not be kept for a rerun ({why}); "
                         "the audit goes on, and a rerun after an interruption forms it again")
