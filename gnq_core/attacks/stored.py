"""The attacks ``gnq extract`` stores, each an ``Attack`` (``contract``): greedy prefix
extraction (attacks/extraction.py), calibrated membership scores (attacks/membership.py),
(n, p)-discoverable extraction (attacks/discoverable.py) and the secret-targeted attack
(attacks/secret_attack.py); ``stored_attacks`` lists those a rule asks for, in order."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gnq_core.attacks import attack_stages as costs
from gnq_core.attacks.contract import Attack, Target
from gnq_core.attacks.defaults import DEFAULT_EXPOSURE_NODES
from gnq_core.attacks.discoverable import METRIC, TEMPERATURE, TOP_K, suffix_logprob
from gnq_core.attacks.extraction import ExtractionResult, extraction_attack, results_frame
from gnq_core.attacks.membership import MIN_K_FRACTION, SCORE_COLUMNS, membership_scores, token_logprobs
from gnq_core.attacks.secret_attack import DETECT, SecretAttack, attack_secrets, describe_rule
from gnq_core.common.progress import TEXTS
from gnq_core.sources.tokens import pad_id

__all__ = ["Discoverable", "GreedyExtraction", "Membership", "SecretValues", "SharedPassages",
           "stored_attacks"]


@dataclass
class GreedyExtraction:
    """Prefix-completion extraction, calibrated by the reference model when there is one.  Its
    rows are committed batch by batch as they are decoded (an interrupted attack resumes), so
    ``run`` writes them and ``store`` reads back the counts."""

    prefix_tokens: int
    threshold: float
    suffix_tokens: int | None
    name: str = "extraction"

    @property
    def stages(self) -> tuple:
        return (costs.TextWindows(self.prefix_tokens, self.suffix_tokens),)

    def run(self, t: Target) -> None:
        kwargs = dict(prefix_tokens=self.prefix_tokens, threshold=self.threshold, batch_size=t.batch_size,
                      device=t.device, suffix_tokens=self.suffix_tokens)
        example_ids, store, run = t.example_ids, t.store, t.run
        finished = store.attacked_examples(run.run_id, t.point, self.prefix_tokens, self.threshold)
        if finished is None or len(finished) >= len(t.examples):
            store.delete_extractions(run.run_id, t.point, self.prefix_tokens)  # a new attack replaces the old
            finished = set()
        elif finished:
            t.reporter.log(f"resuming the attack: {len(finished)} of {len(t.examples)} texts already done")

        def commit(results: list[ExtractionResult]) -> None:
            frame = results_frame(t.tokenizer, results, self.threshold)
            if self.suffix_tokens is not None:
                frame["suffix_tokens"] = self.suffix_tokens
            if t.windows is not None:  # the turn each window is in, and whether it was trained
                where = {int(e): w for e, w in zip(example_ids, t.windows, strict=True)}
                frame["turn"] = [getattr(where[int(e)], "turn", None) for e in frame["example_id"]]
                frame["turn_trained"] = pd.array([getattr(where[int(e)], "trained", None)
                                                  for e in frame["example_id"]], dtype="boolean")
            if t.reference is not None:  # a skipped text has no reference result either
                refs = [r.reference or r for r in results]
                frame["reference_match"] = [r.match_fraction for r in refs]
                frame["reference_generated"] = [r.generated_text for r in refs]
            store.write_extractions(run.run_id, t.point, self.prefix_tokens, frame, t.version)

        # the reference decodes the same batches as the checkpoint (attacks.generation)
        also = f" and reference {Path(t.reference_path).name}" if t.reference is not None else ""
        t.reporter.stage(f"attack {t.label}{also} (p={self.prefix_tokens})", len(t.ids), TEXTS)
        extraction_attack(t.model, t.tokenizer, t.ids, example_ids, progress=t.reporter.advance,
                          done=finished, on_batch=commit, reference=t.reference, starts=t.starts, **kwargs)

    def store(self, t: Target, result: None) -> dict:
        """Counts and both models' match rates over the attackable texts."""
        stored = t.store.extractions(t.run.run_id, t.point)
        stored = stored[stored["prefix_tokens"] == self.prefix_tokens]
        attackable = stored[stored["match_fraction"].notna()]
        reproduced = attackable["success"].fillna(False).astype(bool)
        ref = attackable["reference_match"].astype(float) if "reference_match" in attackable else None
        ref_hit = (ref >= self.threshold) if ref is not None else reproduced & False
        return {"attacked": len(attackable), "skipped": len(stored) - len(attackable),
                "reproduced": int(reproduced.sum()), "reference_reproduced": int(ref_hit.sum()),
                "both_reproduced": int((reproduced & ref_hit).sum()),
                "extracted": int((reproduced & ~ref_hit).sum()),
                "mean_match": float(attackable["match_fraction"].mean()) if len(attackable) else None,
                "reference_mean_match": float(ref.mean()) if ref is not None and ref.notna().any() else None}


@dataclass
class Membership:
    """Calibrated membership scores of every text (needs the reference model), as metrics."""

    name: str = "membership"
    stages: tuple = (costs.MembershipScores(),)

    def run(self, t: Target) -> pd.DataFrame:
        pad = pad_id(t.tokenizer)
        t.reporter.stage("membership scores: every text under both models", 2 * len(t.ids), TEXTS)
        target = token_logprobs(t.model, t.ids, pad, t.batch_size, t.device)
        t.reporter.advance(len(t.ids))
        reference = token_logprobs(t.reference, t.ids, pad, t.batch_size, t.device)
        t.reporter.advance(len(t.ids))
        return membership_scores(t.texts, target, reference)

    def store(self, t: Target, scores: pd.DataFrame) -> dict:
        settings = {"checkpoint": t.label, "reference": str(t.reference_path),
                    "min_k_fraction": MIN_K_FRACTION}
        for metric in SCORE_COLUMNS:
            t.store.write_metric(t.run.run_id, metric, pd.DataFrame({"example_id": t.example_ids,
                                                                     "value": scores[metric]}), settings)
        return {}


@dataclass
class Discoverable:
    """log q of each text's suffix under the stored sampler, with the rule."""

    prefix_tokens: int
    suffix_tokens: int
    name: str = "discoverable"

    @property
    def stages(self) -> tuple:
        return (costs.DiscoverableLikelihood(self.prefix_tokens, self.suffix_tokens),)

    def run(self, t: Target) -> list[float]:
        t.reporter.stage(f"discoverable: each text's suffix likelihood (p={self.prefix_tokens})", len(t.ids),
                         TEXTS)
        values = suffix_logprob(t.model, t.ids, self.prefix_tokens, self.suffix_tokens, pad_id(t.tokenizer),
                                batch_size=t.batch_size, device=t.device, starts=t.starts)
        t.reporter.advance(len(t.ids))
        return values

    def store(self, t: Target, values: list[float]) -> dict:
        p, s = self.prefix_tokens, self.suffix_tokens
        frame = pd.DataFrame({"example_id": t.example_ids, "value": values})
        t.store.write_metric(t.run.run_id, METRIC, frame, {
            "rule": f"log probability that top-{TOP_K} sampling at temperature {TEMPERATURE:g} emits "
                    f"exactly the next {s} tokens after the first {p} ((n, p)-discoverable: "
                    "1 − (1 − e^value)^n ≥ p)", "prefix_tokens": p, "suffix_tokens": s,
            "top_k": TOP_K, "temperature": TEMPERATURE, "checkpoint": t.label})
        return {}


@dataclass
class SecretValues:
    """The secret-targeted attack on every value stored with the texts (a text labelled before
    values were stored: found again), on the same models; its counts."""

    n_candidates: int
    search_nodes: int = DEFAULT_EXPOSURE_NODES
    name: str = "secrets"
    _found: dict = field(default_factory=dict, repr=False, compare=False)  # per Target: its values

    @property
    def stages(self) -> tuple:
        """Decoding, then (with candidates to rank against) the exposures, as ``attack_secrets``."""
        return (costs.SecretDecode(self),) + ((costs.SecretExposure(self),) if self.n_candidates > 1 else ())

    def rule(self, t: Target) -> str:
        return describe_rule(self.n_candidates, Path(t.reference_path).name if t.reference_path else None,
                             self.search_nodes)

    def stored_values(self, t: Target) -> list:
        """Per text, its stored values (sources.secrets.values_json), None (none), or DETECT (a text
        labelled before values were stored: found again)."""
        ex = t.examples
        return [v if isinstance(v, str) else None if pd.isna(s) else DETECT
                for v, s in zip(ex["secret_values"], ex["secret"], strict=True)]

    def targets(self, t: Target) -> list:
        """The values ``run`` attacks (secret_attack.secret_targets), found once per target."""
        from gnq_core.attacks.secret_attack import secret_targets

        key = id(t)
        if key not in self._found or self._found[key][0] is not t:
            self._found[key] = (t, secret_targets(t.tokenizer, t.texts, t.example_ids, t.ids,
                                                  self.stored_values(t)))
        return self._found[key][1]

    def occurrences(self, t: Target) -> list:
        """The targets as the exposure stage takes them (secret_attack.occurrences_of)."""
        from gnq_core.attacks.secret_attack import occurrences_of

        return occurrences_of(self.targets(t), t.texts, t.example_ids)

    def exposure_settings(self, t: Target):
        from gnq_core.attacks.secret_exposure import Settings

        return Settings(self.n_candidates, self.search_nodes, int(t.run.seed or 0), t.batch_size,
                        t.run.max_length, t.device)

    def run(self, t: Target) -> SecretAttack:
        return attack_secrets(t.model, t.tokenizer, t.texts, t.example_ids, t.ids, reference=t.reference,
                              n_candidates=self.n_candidates, search_nodes=self.search_nodes,
                              seed=int(t.run.seed or 0),
                              batch_size=t.batch_size, device=t.device, rule=self.rule(t),
                              max_length=t.run.max_length, stored_values=self.stored_values(t),
                              progress=t.reporter.stage, advance=t.reporter.advance)

    def store(self, t: Target, result: SecretAttack) -> dict:
        rows = result.rows
        t.store.write_secret_attacks(t.run.run_id, t.point, rows, t.version, result.null, self.rule(t))
        return {"secret_rule": self.rule(t), "secrets_attacked": len(rows),
                "secret_candidates": self.n_candidates, "exposure_nodes": self.search_nodes,
                "secrets_reproduced": int(rows["reproduced"].sum()),
                "secrets_extracted": int(rows["extracted"].sum())}


@dataclass
class SharedPassages:
    """The template's and the data set's shared passages (attacks/windows.py), each probed once:
    given its first p tokens (after the text before it), does greedy decoding reproduce the next s,
    and does the reference?  Reported once, as the data set's, never as a text's leak."""

    prefix_tokens: int
    suffix_tokens: int
    name: str = "shared passages"
    # Not estimated: a handful of passages (those most texts share) decoded in one batch, and no
    # progress stage of its own.
    stages: tuple = ()

    def run(self, t: Target) -> list[dict]:
        from gnq_core.attacks.forward import evaluating
        from gnq_core.attacks.generation import generate
        from gnq_core.attacks.windows import shared_passages

        layouts = t.examples["turns"].tolist() if "turns" in t.examples else None
        found = shared_passages(t.tokenizer, t.texts, layouts, t.ids, t.example_ids)
        where = {e: k for k, e in enumerate(t.example_ids)}
        probes, rows = [], []
        for passage in found:
            tokens = t.ids[where[passage.example_id]]
            at = passage.start + self.prefix_tokens
            n = len(t.tokenizer(passage.text, add_special_tokens=False)["input_ids"])
            if n >= self.prefix_tokens + self.suffix_tokens and at + self.suffix_tokens <= len(tokens):
                probes.append((passage, tokens[:at], tokens[at: at + self.suffix_tokens]))
        if not probes:
            return rows
        models = [t.model] if t.reference is None else [t.model, t.reference]
        with contextlib.ExitStack() as stack:
            for m in models:
                stack.enter_context(evaluating(m))
            out = generate(models, [p for _, p, _ in probes], [len(g) for _, _, g in probes],
                           pad_id(t.tokenizer), batch_size=t.batch_size, device=t.device)
        for k, (passage, _, target) in enumerate(probes):
            rows.append({"passage": passage.text[:200], "texts": passage.texts,
                         "reproduced": out[0][k] == list(target),
                         "reference_reproduced": out[1][k] == list(target) if len(models) > 1 else None})
        return rows

    def store(self, t: Target, rows: list[dict]) -> dict:
        if not rows:  # nothing most texts share: the run's settings stay as they were
            return {}
        return {"shared_passages": rows,
                "shared_passages_rule": "template / boilerplate the model reproduces: passages at least "
                                        "half the texts hold verbatim; given "
                                        f"{self.prefix_tokens} of their tokens, greedy decoding gives the "
                                        f"next {self.suffix_tokens}. They belong to no text: no text's "
                                        "window falls in them"}


def stored_attacks(prefix_tokens: int, threshold: float, suffix_tokens: int | None, calibrated: bool,
                   secret_candidates: int, exposure_nodes: int = DEFAULT_EXPOSURE_NODES) -> list[Attack]:
    """The attacks ``gnq extract`` runs, in order: membership scores only with a reference, the
    discoverable rule only with a fixed suffix length."""
    attacks: list[Attack] = [GreedyExtraction(prefix_tokens, threshold, suffix_tokens)]
    if calibrated:
        attacks.append(Membership())
    if suffix_tokens is not None:
        attacks.append(Discoverable(prefix_tokens, suffix_tokens))
    attacks.append(SecretValues(secret_candidates, exposure_nodes))
    return [*attacks, SharedPassages(prefix_tokens, suffix_tokens or 1)]
