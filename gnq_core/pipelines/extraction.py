"""Prefix-completion extraction attack: reveal the first p tokens of a training text,
greedy-decode the rest, and measure the fraction of continuation tokens that match.

Token convention as in ``tokens``: each example is its text's tokens without special tokens
(``tokens.encode_texts``).  With ``suffix_tokens = s`` (Carlini et al. 2021/2022's
k-extractability, the rule ``gnq extract`` uses) an example needs at least p + s tokens and its
target is exactly ``tokens[p:p+s]``; a shorter text is "not attackable", never an easy success.
Without it (the studies' older rule) an example needs p + 1 tokens and its target is
``tokens[p:]`` (capped at ``max_new_tokens``).

Calibration (``run_extraction`` with a reference): a text counts as *extracted* only when the
audited checkpoint reproduces its suffix and a reference model (the run's first checkpoint, or
a model the user names, e.g. a fine-tune's base) does not: a continuation any model of the
language produces ("1 2 3 4 5 6") is not a leak. Decoding is greedy and never stops at EOS: each
example generates exactly as many tokens as its target and is compared position by position.

Decoding is a hand-written loop (not ``model.generate``): prompts are left-padded, with an
attention mask and explicit position ids from that mask so padding does not shift positions,
and a KV cache feeds one new token per step. It gives the same ids as recomputing the full,
unpadded forward for each example at every step (tests/test_extraction.py checks this).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gnq_core.pipelines.attack_defaults import (  # noqa: F401 (FIRST_CHECKPOINT: re-exported)
    DEFAULT_ATTACK_BATCH,
    DEFAULT_PREFIX,
    DEFAULT_REFERENCE,
    DEFAULT_SECRET_CANDIDATES,
    DEFAULT_SUFFIX,
    DEFAULT_THRESHOLD,
    FIRST_CHECKPOINT,
)
from gnq_core.sources.tokenizer_panics import panics_as_one_line
from gnq_core.sources.tokens import pad_id


@dataclass
class ExtractionResult:
    example_id: int
    n_prefix: int  # p actually used
    n_continuation: int  # number of target tokens compared (0 if the text is too short -> skipped)
    match_fraction: float | None  # fraction of positions i with generated[i] == target[i]; None if skipped
    success: bool | None  # match_fraction >= threshold; None if skipped
    prefix_text: str  # tokenizer.decode of the prefix ids
    generated_text: str  # decode of the generated continuation ids
    target_text: str  # decode of the original continuation ids
    generated_ids: list[int]
    target_ids: list[int]

    @property
    def skipped(self) -> bool:
        return self.match_fraction is None


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def greedy_decode(model: torch.nn.Module, prompts: Sequence[Sequence[int]], n_new: int, pad: int,
                  device: torch.device | None = None) -> list[list[int]]:
    """Greedily generate ``n_new`` tokens after each prompt, batched (left padding + KV cache).

    Prompts may differ in length (each needs at least one token). No EOS stopping. Call inside
    ``torch.inference_mode()`` with the model in eval mode (``extraction_attack`` does both).
    """
    if not prompts or n_new <= 0:
        return [[] for _ in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = device if device is not None else _model_device(model)
    B, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, width), pad, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    # Positions count real tokens only: the first real token of every row is position 0.
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}

    out_ids = torch.empty((B, n_new), dtype=torch.long, device=device)
    past = None
    for step in range(n_new):
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                    past_key_values=past, use_cache=True, **extra)
        nxt = out.logits[:, -1, :].argmax(dim=-1)
        out_ids[:, step] = nxt
        if step == n_new - 1:
            break
        past = out.past_key_values
        input_ids = nxt[:, None]
        position_ids = position_ids[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
    return out_ids.tolist()


def extraction_attack(model: torch.nn.Module, tokenizer, token_ids: Sequence[Sequence[int]],
                      example_ids: Sequence[int], *, prefix_tokens: int = 12, threshold: float = 1.0,
                      batch_size: int = 32, max_new_tokens: int | None = None,
                      suffix_tokens: int | None = None,
                      device: torch.device | None = None,
                      progress: Callable[[int], None] | None = None,
                      done: Collection[int] = (),
                      on_batch: Callable[[list[ExtractionResult]], None] | None = None,
                      ) -> list[ExtractionResult]:
    """Run the prefix-completion attack on already-encoded examples; results in input order.

    ``progress(n)`` is called with the number of examples finished by each batch (skipped,
    too-short examples are reported first, in one call), so the calls sum to ``len(token_ids)``.

    Resuming: ``on_batch(results)`` receives each batch's results as soon as they exist (the
    too-short examples first), so a caller can commit them; a later call with the committed
    example ids as ``done`` skips every batch made only of those.  Batches are formed from all
    examples, done or not, so each example is decoded with the same companions (and padding)
    as in an uninterrupted attack.  The results returned are those computed by this call.
    """
    if len(token_ids) != len(example_ids):
        raise ValueError(f"{len(token_ids)} token lists but {len(example_ids)} example ids")
    if prefix_tokens < 1:
        raise ValueError("prefix_tokens must be at least 1")
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1 (or None for the whole continuation)")
    if suffix_tokens is not None:
        if suffix_tokens < 1:
            raise ValueError("suffix_tokens must be at least 1")
        max_new_tokens = suffix_tokens
    needed = prefix_tokens + (suffix_tokens or 1)
    device = device if device is not None else _model_device(model)
    pad = pad_id(tokenizer)

    done = set(done)
    results: list[ExtractionResult | None] = [None] * len(token_ids)
    todo: list[int] = []
    for i, (ids, eid) in enumerate(zip(token_ids, example_ids, strict=True)):
        ids = [int(t) for t in ids]
        if len(ids) >= needed:
            todo.append(i)
            continue
        if int(eid) in done:
            continue
        prefix = ids[:prefix_tokens]
        results[i] = ExtractionResult(int(eid), len(prefix), 0, None, None, tokenizer.decode(prefix),
                                      "", "", [], [])
    n_skipped = len(token_ids) - len(todo)
    short = [r for r in results if r is not None]
    if on_batch is not None and short:
        on_batch(short)
    if progress is not None and n_skipped:
        progress(n_skipped)

    def target_of(i: int) -> list[int]:
        tgt = [int(t) for t in token_ids[i][prefix_tokens:]]
        return tgt if max_new_tokens is None else tgt[:max_new_tokens]

    # Longest targets first: similar lengths share a batch, so little generation is wasted.
    todo.sort(key=lambda i: len(target_of(i)), reverse=True)

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(todo), batch_size):
                chunk = todo[start: start + batch_size]
                if all(int(example_ids[i]) in done for i in chunk):
                    if progress is not None:
                        progress(len(chunk))
                    continue
                prefixes = [[int(t) for t in token_ids[i][:prefix_tokens]] for i in chunk]
                targets = [target_of(i) for i in chunk]
                generated = greedy_decode(model, prefixes, max(len(t) for t in targets), pad, device)
                for i, prefix, target, gen in zip(chunk, prefixes, targets, generated, strict=True):
                    gen = gen[: len(target)]
                    match = sum(g == t for g, t in zip(gen, target, strict=True)) / len(target)
                    results[i] = ExtractionResult(
                        example_id=int(example_ids[i]), n_prefix=len(prefix), n_continuation=len(target),
                        match_fraction=match, success=match >= threshold,
                        prefix_text=tokenizer.decode(prefix), generated_text=tokenizer.decode(gen),
                        target_text=tokenizer.decode(target), generated_ids=gen, target_ids=target)
                if on_batch is not None:
                    on_batch([results[i] for i in sorted(chunk)])  # type: ignore[misc]
                if progress is not None:
                    progress(len(chunk))
    finally:
        model.train(was_training)
    return [r for r in results if r is not None]




@dataclass(frozen=True)
class AttackRule:
    """What "extracted" means for one stored attack (recorded in the run's settings)."""

    prefix_tokens: int = DEFAULT_PREFIX
    suffix_tokens: int | None = DEFAULT_SUFFIX  # None: the rest of the text (the studies' rule)
    threshold: float = DEFAULT_THRESHOLD
    reference: str | None = DEFAULT_REFERENCE  # None: no calibration; else "first" or a model folder

    def describe(self, reference_name: str | None) -> str:
        target = (f"exactly the next {self.suffix_tokens} tokens" if self.suffix_tokens
                  else "the rest of the text")
        match = "all of them" if self.threshold >= 1.0 else f"at least {self.threshold:.0%} of them"
        calibrated = (f", and the reference model ({reference_name}) does not" if reference_name else "")
        needed = self.prefix_tokens + (self.suffix_tokens or 1)
        short = f"; texts shorter than {needed} tokens are not attackable"
        return (f"extracted = given the first {self.prefix_tokens} tokens, greedy decoding reproduces "
                f"{target} ({match}){calibrated}{short}")


def run_extraction(store, run, *, checkpoint: str | None = None, prefix_tokens: int = DEFAULT_PREFIX,
                   threshold: float = DEFAULT_THRESHOLD, batch_size: int = DEFAULT_ATTACK_BATCH,
                   device: str = "auto", suffix_tokens: int | None = DEFAULT_SUFFIX,
                   reference: str | None = DEFAULT_REFERENCE,
                   reporter=None, secret_candidates: int = DEFAULT_SECRET_CANDIDATES) -> dict:
    """Attack every example of a stored run with one of its checkpoints; store the results.

    ``checkpoint`` is a point label (e.g. 'epoch-3'); default: the run's last finished point.
    ``suffix_tokens`` / ``reference``: the calibrated rule (see the module docstring; ``gnq
    extract`` defaults to s = 8 and the first checkpoint); ``reference`` is ``"first"`` or a
    checkpoint folder.  With a reference, the membership scores (pipelines/membership.py) are
    stored per text, and the rule with both models' match rates in the run's settings.  A
    reference that tokenizes the texts differently is refused before anything is written.
    Each batch's rows are committed as soon as they are decoded, so an interrupted attack resumes
    where it stopped when rerun with the same prefix length and threshold (and, to decode each
    text with the same companions, the same batch size); rerunning a finished attack, or one with
    another threshold, replaces it.  Never duplicates rows.
    """
    from gnq_core.pipelines.text_labels import ensure_text_labels
    from gnq_core.progress import Reporter
    from gnq_core.runtime import code_version, resolve_device
    from gnq_core.sources.adapters import load_model_at
    from gnq_core.sources.checkpoints import TOKENIZER_FILES
    from gnq_core.sources.tokens import encode_texts

    reporter = reporter or Reporter()
    rule = AttackRule(prefix_tokens, suffix_tokens, threshold, reference)
    row = _attacked_point(store, run, checkpoint)
    ref_path = _reference_path(store, run, row, reference)
    if reference is not None and ref_path is None:
        reporter.log(f"run {run.name!r}: the checkpoint attacked ({row['label']}) is its first, so the "
                     "attack is not calibrated; name a reference with --reference (a fine-tune: its base)")
    point, dev = int(row["point"]), resolve_device(device)
    tokenizer_dir = run.settings.get("tokenizer")  # checkpoints saved without one (gnq audit --tokenizer)
    base = run.settings.get("base_model")  # an audit of PEFT adapter checkpoints: merged into it here
    model, tokenizer = load_model_at(row["path"], base, device=dev, tokenizer=tokenizer_dir)
    examples = ensure_text_labels(store, run)
    texts = examples["text"].tolist()
    ids = encode_texts(tokenizer, texts, run.max_length)
    ref_model = None
    if ref_path is not None:
        own = any((Path(ref_path) / name).is_file() for name in TOKENIZER_FILES)
        ref_model, ref_tokenizer = load_model_at(ref_path, base, device=dev,
                                                 tokenizer=None if own else tokenizer_dir)
        _check_same_tokens(ref_path, ref_tokenizer, tokenizer, texts, run.max_length, ids)
    example_ids = examples["example_id"].tolist()
    kwargs = dict(prefix_tokens=prefix_tokens, threshold=threshold, batch_size=batch_size,
                  device=dev, suffix_tokens=suffix_tokens)
    ref_results: dict[int, ExtractionResult] = {}
    if ref_model is not None:
        reporter.stage(f"reference {Path(ref_path).name} (p={prefix_tokens})", len(ids))
        ref_results = {r.example_id: r for r in extraction_attack(ref_model, tokenizer, ids, example_ids,
                                                                  progress=reporter.advance, **kwargs)}
    finished = store.attacked_examples(run.run_id, point, prefix_tokens, threshold)
    if finished is None or len(finished) >= len(examples):
        store.delete_extractions(run.run_id, point, prefix_tokens)  # a new attack replaces the old one
        finished = set()
    elif finished:
        reporter.log(f"resuming the attack: {len(finished)} of {len(examples)} texts already done")
    version = code_version()

    def commit(results: list[ExtractionResult]) -> None:
        frame = _frame(tokenizer, results, threshold)
        if suffix_tokens is not None:
            frame["suffix_tokens"] = suffix_tokens
        if ref_results:
            refs = [ref_results[r.example_id] for r in results]
            frame["reference_match"] = [r.match_fraction for r in refs]
            frame["reference_generated"] = [r.generated_text for r in refs]
        store.write_extractions(run.run_id, point, prefix_tokens, frame, version)

    reporter.stage(f"attack {row['label']} (p={prefix_tokens})", len(ids))
    extraction_attack(model, tokenizer, ids, example_ids, progress=reporter.advance, done=finished,
                      on_batch=commit, **kwargs)
    if ref_model is not None:
        _store_membership(store, run, texts, example_ids, ids, model, ref_model, tokenizer, dev,
                          batch_size, {"checkpoint": row["label"], "reference": str(ref_path)})
    if suffix_tokens is not None:
        _store_discoverable(store, run, example_ids, ids, model, tokenizer, dev, batch_size, prefix_tokens,
                            suffix_tokens, row["label"])
    secrets = _attack_secrets(store, run, point, model, ref_model, tokenizer, examples, ids,
                              ref_path, batch_size, dev, version, reporter, secret_candidates)
    stored = store.extractions(run.run_id, point)
    stored = stored[stored["prefix_tokens"] == prefix_tokens]
    summary = _summary(stored, threshold) | secrets
    summary["label"] = row["label"]
    store.update_settings(run.run_id, {"attack": {
        "rule": rule.describe(Path(ref_path).name if ref_path else None),
        "prefix_tokens": prefix_tokens, "suffix_tokens": suffix_tokens, "threshold": threshold,
        "checkpoint": row["label"], "reference": str(ref_path) if ref_path else None,
        "code_version": version} | {k: v for k, v in summary.items() if k != "label"}})
    return summary


def _attack_secrets(store, run, point, model, ref_model, tokenizer, examples, ids, ref_path,
                    batch_size, device, version, reporter, n_candidates: int) -> dict:
    """The secret-targeted attack (pipelines/secret_attack.py) on the same models, on every value
    stored with the texts (a text labelled before values were stored: found again); its counts."""
    import pandas as pd

    from gnq_core.pipelines.secret_attack import DETECT, attack_secrets, describe_rule

    rule = describe_rule(n_candidates, Path(ref_path).name if ref_path else None)
    stored = [v if isinstance(v, str) else None if pd.isna(s) else DETECT
              for v, s in zip(examples["secret_values"], examples["secret"], strict=True)]
    rows = attack_secrets(model, tokenizer, examples["text"].tolist(), examples["example_id"].tolist(), ids,
                          reference=ref_model, n_candidates=n_candidates, seed=int(run.seed or 0),
                          batch_size=batch_size, device=device, rule=rule, max_length=run.max_length,
                          stored_values=stored, progress=reporter.stage, advance=reporter.advance)
    store.write_secret_attacks(run.run_id, point, rows, version)
    return {"secret_rule": rule, "secrets_attacked": len(rows), "secret_candidates": n_candidates,
            "secrets_reproduced": int(rows["reproduced"].sum()),
            "secrets_extracted": int(rows["extracted"].sum())}


def _summary(stored, threshold: float) -> dict:
    """Counts and both models' match rates over the attackable texts."""
    attackable = stored[stored["match_fraction"].notna()]
    reproduced = attackable["success"].fillna(False).astype(bool)
    ref = attackable["reference_match"].astype(float) if "reference_match" in attackable else None
    ref_hit = (ref >= threshold) if ref is not None else reproduced & False
    return {"attacked": len(attackable), "skipped": len(stored) - len(attackable),
            "reproduced": int(reproduced.sum()), "reference_reproduced": int(ref_hit.sum()),
            "both_reproduced": int((reproduced & ref_hit).sum()),
            "extracted": int((reproduced & ~ref_hit).sum()),
            "mean_match": float(attackable["match_fraction"].mean()) if len(attackable) else None,
            "reference_mean_match": float(ref.mean()) if ref is not None and ref.notna().any() else None}


def _attacked_point(store, run, checkpoint: str | None):
    from gnq_core.pipelines.protected_paths import verify_checkpoint
    from gnq_core.results.store import StoreError

    points = store.points(run.run_id)
    done = points[points["status"] == "done"]
    if done.empty:
        raise StoreError(f"{store.path}: run {run.name!r} has no finished checkpoint to attack yet")
    if checkpoint is None:
        row = done.iloc[-1]
    else:
        match = points[points["label"] == checkpoint]
        if match.empty:
            raise StoreError(f"{store.path}: run {run.name!r} has no checkpoint {checkpoint!r} "
                             f"(has: {', '.join(points['label'])})")
        row = match.iloc[0]
    if not isinstance(row["path"], str) or not row["path"]:  # NULL reads as None or NaN
        raise StoreError(f"{store.path}: checkpoint {row['label']!r} of run {run.name!r} has no folder "
                         "recorded (uploaded checkpoints are deleted after the audit, all but the last); "
                         "audit from a local path to attack it")
    if not Path(row["path"]).exists():
        raise StoreError(f"{row['path']}: checkpoint {row['label']!r} of run {run.name!r} is no longer "
                         "there (moved or deleted since the audit)")
    verify_checkpoint(row["path"], row.get("model_hash"), f"checkpoint {row['label']!r} of run {run.name!r}")
    return row


def _reference_path(store, run, target, reference: str | None) -> str | None:
    """The reference model's folder: the run's first finished checkpoint, or the one named; None
    without one, or when the first checkpoint is the one attacked."""
    if reference is None:
        return None
    if reference != FIRST_CHECKPOINT:
        return str(Path(reference).resolve())  # recorded absolute: outputs elsewhere must not replace it
    from gnq_core.pipelines.protected_paths import verify_checkpoint

    points = store.points(run.run_id)
    first = points[(points["status"] == "done") & points["path"].notna()]
    if first.empty or int(first.iloc[0]["point"]) == int(target["point"]):
        return None  # the first checkpoint is the one attacked: nothing to calibrate against
    row = first.iloc[0]
    verify_checkpoint(row["path"], row.get("model_hash"), f"checkpoint {row['label']!r} of run {run.name!r}")
    return str(row["path"])


def _check_same_tokens(ref_path: str, ref_tokenizer, tokenizer, texts, max_length: int, ids) -> None:
    """The reference must read the texts as the same token ids, or "the same continuation" means
    nothing: refused in one line before anything is written."""
    from gnq_core.sources.checkpoints import CheckpointError
    from gnq_core.sources.tokens import encode_texts

    if ref_tokenizer.get_vocab() != tokenizer.get_vocab() or encode_texts(ref_tokenizer, texts,
                                                                          max_length) != ids:
        raise CheckpointError(f"{ref_path}: the reference model's tokenizer differs from the audited "
                              "model's; a calibrated attack needs both to read the texts as the same tokens")


def _store_membership(store, run, texts, example_ids, ids, model, ref_model, tokenizer, device,
                      batch_size: int, settings: dict) -> None:
    import pandas as pd

    from gnq_core.pipelines.membership import MIN_K_FRACTION, SCORE_COLUMNS, membership_scores, token_logprobs

    pad = pad_id(tokenizer)
    target = token_logprobs(model, ids, pad, batch_size, device)
    reference = token_logprobs(ref_model, ids, pad, batch_size, device)
    scores = membership_scores(texts, target, reference)
    settings = settings | {"min_k_fraction": MIN_K_FRACTION}
    for metric in SCORE_COLUMNS:
        store.write_metric(run.run_id, metric, pd.DataFrame({"example_id": example_ids,
                                                             "value": scores[metric]}), settings)


def _store_discoverable(store, run, example_ids, ids, model, tokenizer, device, batch_size: int,
                        prefix_tokens: int, suffix_tokens: int, label: str) -> None:
    """log q of each text's suffix under the stored sampler (pipelines/discoverable.py), with the rule."""
    import pandas as pd

    from gnq_core.pipelines.discoverable import METRIC, TEMPERATURE, TOP_K, suffix_logprob

    values = suffix_logprob(model, ids, prefix_tokens, suffix_tokens, pad_id(tokenizer),
                            batch_size=batch_size, device=device)
    store.write_metric(run.run_id, METRIC, pd.DataFrame({"example_id": example_ids, "value": values}), {
        "rule": f"log probability that top-{TOP_K} sampling at temperature {TEMPERATURE:g} emits exactly the "
                f"next {suffix_tokens} tokens after the first {prefix_tokens} ((n, p)-discoverable: "
                "1 − (1 − e^value)^n ≥ p)", "prefix_tokens": prefix_tokens, "suffix_tokens": suffix_tokens,
        "top_k": TOP_K, "temperature": TEMPERATURE, "checkpoint": label})


def _frame(tokenizer, results: Sequence[ExtractionResult], threshold: float):
    """Results in the store's layout (one row per example)."""
    import pandas as pd

    return pd.DataFrame({
        "example_id": [r.example_id for r in results],
        "threshold": threshold,
        "n_continuation": [r.n_continuation for r in results],
        "match_fraction": [r.match_fraction for r in results],
        "success": pd.array([r.success for r in results], dtype="boolean"),
        "prefix_text": [r.prefix_text for r in results],
        "generated_text": [r.generated_text for r in results],
        "target_text": [r.target_text for r in results],
        "target_tokens": [_token_strings(tokenizer, r.target_ids) for r in results],
        "generated_tokens": [_token_strings(tokenizer, r.generated_ids) for r in results],
    })


def _token_strings(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (for a token-by-token view of the attack); under one panic
    guard for all of them (the backend's own guard per call would redirect stderr per token)."""
    with panics_as_one_line(getattr(tokenizer, "name_or_path", "") or "the tokenizer",
                            "the tokenizer failed while decoding"):
        return [tokenizer.decode([i]) for i in ids]
