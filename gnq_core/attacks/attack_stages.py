"""The stored attacks' stages as the estimate sees them (attacks/stage_cost.py): each counts its
work with the attack's own selection and times a few units of the attack's own code on the
probe's ``Target`` (one model: the reference does the same work, so a calibrated attack's line
counts it twice).  ``attacks/stored.py`` gives each attack its stages (``Attack.stages``); the
labels are those its ``run`` reports (``Reporter.stage``), so a test can check every stage run
has its line."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from gnq_core.attacks.contract import Target
from gnq_core.attacks.stage_cost import WARM_UP_S, Clock, Line, Probe, Work
from gnq_core.common.progress import SECRET_VALUES, TEXTS
from gnq_core.sources.tokens import pad_id

EXPOSURE_VALUES = 16  # values timed at most, cycling over the formats (their mean is used)
EXPOSURE_PROBE_S = 10.0  # no further value is timed once the probe's exposures took this long


def _models(work: Work) -> int:
    return 2 if work.reference else 1


def _batches(n: int, work: Work) -> int:
    return math.ceil(n / max(1, work.attack_batch))


@dataclass(frozen=True)
class TextWindows:
    """attacks.extraction: each attackable text's window greedy-decoded, the reference on the same
    batches; a unit is one batch of attackable texts."""

    prefix_tokens: int
    suffix_tokens: int | None
    key: str = "attack"
    label: re.Pattern[str] = re.compile(r"^attack .* \(p=\d+\)$")  # GreedyExtraction.run's stage

    def count(self, t: Target, scale: float) -> dict[str, int]:
        from gnq_core.attacks.extraction import attackable

        return {"attackable": round(len(attackable(t.ids, self.prefix_tokens, self.suffix_tokens, t.starts))
                                    * scale)}

    def measure(self, t: Target, clock: Clock) -> dict[str, float | None]:
        from gnq_core.attacks.extraction import attackable, extraction_attack

        chosen = attackable(t.ids, self.prefix_tokens, self.suffix_tokens, t.starts)[: t.batch_size]
        if not chosen:
            return {"decode_s": 0.0}  # nothing to decode: the line counts no batch
        ids, starts = [t.ids[i] for i in chosen], t.starts
        picked = None if starts is None else [starts[i] for i in chosen]
        return {"decode_s": clock.timed(lambda: extraction_attack(
            t.model, t.tokenizer, ids, chosen, prefix_tokens=self.prefix_tokens, batch_size=len(ids),
            suffix_tokens=self.suffix_tokens, device=t.device, starts=picked))}

    def line(self, work: Work, probe: Probe) -> Line:
        n, models, per = _batches(work.attackable, work), _models(work), max(1, work.attack_batch)
        return Line(self.key, "text windows, audited checkpoint" + (" and reference model" if work.reference
                                                                     else ""),
                    work.texts, TEXTS, models * (probe.load_s + n * probe.decode_s),
                    f"{models} model(s) on the same batches × ({n} batch(es) of {per} × "
                    f"{probe.decode_s:.2f} s measured, + a load); texts under p + s tokens are skipped at "
                    "no cost")


@dataclass(frozen=True)
class MembershipScores:
    """attacks.membership.token_logprobs of every text under both models; a unit is one batch."""

    key: str = "membership"
    label: re.Pattern[str] = re.compile(r"^membership scores")  # Membership.run's stage

    def count(self, t: Target, scale: float) -> dict[str, int]:
        return {}  # every text: Work.texts

    def measure(self, t: Target, clock: Clock) -> dict[str, float | None]:
        from gnq_core.attacks.membership import token_logprobs

        batch = t.ids[: t.batch_size]
        return {"forward_s": clock.timed(lambda: token_logprobs(t.model, batch, pad_id(t.tokenizer),
                                                                t.batch_size, t.device))}

    def line(self, work: Work, probe: Probe) -> Line:
        n = _batches(work.texts, work)
        return Line(self.key, "membership scores (both models)", 2 * work.texts, TEXTS,
                    2 * n * probe.forward_s, f"2 × {n} forward(s) × {probe.forward_s:.2f} s measured")


@dataclass(frozen=True)
class DiscoverableLikelihood:
    """attacks.discoverable.suffix_logprob: one forward of each attackable text cut to its window's
    end; a unit is one batch of them."""

    prefix_tokens: int
    suffix_tokens: int
    key: str = "discoverable"
    label: re.Pattern[str] = re.compile(r"^discoverable")  # Discoverable.run's stage

    def count(self, t: Target, scale: float) -> dict[str, int]:
        return {}  # the texts TextWindows counts as attackable (the same rule)

    def measure(self, t: Target, clock: Clock) -> dict[str, float | None]:
        from gnq_core.attacks.discoverable import suffix_logprob
        from gnq_core.attacks.extraction import attackable

        chosen = attackable(t.ids, self.prefix_tokens, self.suffix_tokens, t.starts)[: t.batch_size]
        if not chosen:
            return {"suffix_forward_s": 0.0}
        ids = [t.ids[i] for i in chosen]
        starts = None if t.starts is None else [t.starts[i] for i in chosen]
        return {"suffix_forward_s": clock.timed(lambda: suffix_logprob(
            t.model, ids, self.prefix_tokens, self.suffix_tokens, pad_id(t.tokenizer), batch_size=len(ids),
            device=t.device, starts=starts))}

    def line(self, work: Work, probe: Probe) -> Line:
        if probe.suffix_forward_s is None:  # not measured: every text at full length, an upper bound
            n = _batches(work.texts, work)
            return Line(self.key, "discoverable likelihood", work.texts, TEXTS, n * probe.forward_s,
                        f"{n} forward(s) × {probe.forward_s:.2f} s measured (at full length: an upper bound)")
        n = _batches(work.attackable, work)
        return Line(self.key, "discoverable likelihood", work.texts, TEXTS, n * probe.suffix_forward_s,
                    f"{n} forward(s) of texts cut to p + s tokens × {probe.suffix_forward_s:.2f} s measured")


@dataclass(frozen=True)
class SecretDecode:
    """attacks.secret_attack.decode_values: every secret value greedy-decoded after its prompt, by
    each model; a unit is the attack's first batch of values (its longest), spread over every batch
    by its token-forwards (rows × (padded prompt + new tokens))."""

    attack: Any  # the stored SecretValues attack: its targets
    key: str = "secret decode"
    label: re.Pattern[str] = re.compile(r"^secret values decoded by the ")  # attack_secrets' stage

    def count(self, t: Target, scale: float) -> dict[str, int]:
        return {"secret_values": round(len(self.attack.targets(t)) * scale)}

    def measure(self, t: Target, clock: Clock) -> dict[str, float | None]:
        targets = self.attack.targets(t)
        return {"secret_decode_s": secret_decode_seconds(t.model, targets, pad_id(t.tokenizer), t.batch_size,
                                                         t.device, clock) if targets else None}

    def line(self, work: Work, probe: Probe) -> Line:
        models = _models(work)
        if probe.secret_decode_s is not None:
            seconds = work.secret_values * probe.secret_decode_s
            said = (f"{models} model(s) × {work.secret_values} value(s) × {probe.secret_decode_s:.3f} s "
                    "each, measured on a batch of the run's own secret prompts")
        else:
            n = _batches(work.secret_values, work)
            seconds = n * probe.decode_s
            said = f"{models} model(s) × {n} batch(es), each as a text window's decoding"
        return Line(self.key, "secret values decoded", models * work.secret_values, SECRET_VALUES,
                    models * seconds, said)


def secret_decode_seconds(model, targets, pad: int, batch_size: int, device, clock: Clock) -> float:
    """Seconds to greedy-decode one secret value (``SecretDecode``)."""
    from gnq_core.attacks.generation import plan_batches
    from gnq_core.attacks.secret_attack import decode_values

    prompts = [t.prompt_ids for t in targets]
    n_new = [len(t.target_ids) for t in targets]
    batches = plan_batches(prompts, n_new, batch_size)

    def work(b: list[int]) -> int:
        return len(b) * (max(len(prompts[i]) for i in b) + n_new[b[0]])

    first = [targets[i] for i in batches[0]]
    seconds = clock.timed(lambda: decode_values([model], first, pad, batch_size=batch_size, device=device))
    return seconds * sum(map(work, batches)) / work(batches[0]) / len(targets)


@dataclass(frozen=True)
class SecretExposure:
    """attacks.secret_exposure: each distinct value's exposure under each model, and the null's
    never-trained values after their format's prompts.  Units: pairs, a format's in turn, up to
    EXPOSURE_VALUES within EXPOSURE_PROBE_S (one pair at least; a first value quicker than
    WARM_UP_S is timed again), after the vocabulary's strings are built (once per tokenizer): one
    of the run's values after its own prompt on a fresh scorer (as each distinct value), then a
    never-trained value of its format after that prompt on the scorer the first used (as the
    null's values, which share their format's prompts: the search's nodes already computed, the
    random candidates not).  The run's own values, not never-trained ones, come first: a value the
    model has partly learned is searched deeper before its rank is known or estimated (several
    times a never-trained value's cost on a fine-tuned model), and a value's cost varies
    several-fold with how far its search goes, hence several."""

    attack: Any  # the stored SecretValues attack: its occurrences and settings
    key: str = "exposure"
    label: re.Pattern[str] = re.compile(r"^secret-like values: exact rank or estimate")  # run_exposures'

    def count(self, t: Target, scale: float) -> dict[str, int]:
        from gnq_core.attacks.secret_exposure import first_occurrences, formats_of, relative_kinds

        first = first_occurrences(self.attack.occurrences(t))
        relative = relative_kinds(self.attack.occurrences(t))
        return {"distinct_values": round(len(first) * scale), "formats": len(formats_of(first)),
                "relative_values": round(sum(map(len, relative.values())) * scale),
                "relative_kinds": len(relative)}

    def measure(self, t: Target, clock: Clock) -> dict[str, float | None]:
        from gnq_core.attacks.exposure import token_strings
        from gnq_core.attacks.secret_attack import values_by_kind
        from gnq_core.attacks.secret_exposure import Measurer, first_occurrences, formats_of, null_values

        relative_s = self.relative_seconds(t, clock)
        formats = list(formats_of(first_occurrences(self.attack.occurrences(t))).values())
        if not formats:
            return {"exposure_s": None, "exposure_shared_s": None, "relative_s": relative_s}
        taken = values_by_kind(self.attack.targets(t))
        settings = self.attack.exposure_settings(t)
        token_strings(t.tokenizer)
        order = [members[i % len(members)] for i in range(EXPOSURE_VALUES) for members in formats]
        rng = random.Random(settings.seed)

        def pair(o, space) -> tuple[float, float]:
            measurer = Measurer(t.tokenizer, settings)  # a fresh scorer, then the one it filled
            t0 = clock.now()
            measurer.measure(t.model, o, space)
            t1 = clock.now()
            never = null_values(space, taken.get(o.kind, set()), rng, 1) or [space.value]
            measurer.measure(t.model, o, dataclasses.replace(space, value=never[0]))
            return t1 - t0, clock.now() - t1

        fresh: list[float] = []
        shared: list[float] = []
        if pair(*order[0])[0] >= WARM_UP_S:  # else timed again (it paid one-time costs)
            order = order[1:] or order
        for o, space in order[: EXPOSURE_VALUES // 2]:
            if fresh and sum(fresh) + sum(shared) > EXPOSURE_PROBE_S:
                break
            own, other = pair(o, space)
            fresh.append(own)
            shared.append(other)
        return {"exposure_s": sum(fresh) / len(fresh), "exposure_shared_s": sum(shared) / len(shared),
                "relative_s": relative_s}

    def relative_seconds(self, t: Target, clock: Clock) -> float | None:
        """One value measured relative to the reference (attacks/exposure_relative.py): its
        reference draws and its share of its kind's never-trained values, on a fresh scorer; the
        probe's model stands in for both models (the same shapes, the same work).  None: no such
        value (the line counts it only where the run has a reference)."""
        from gnq_core.attacks.exposure import Scorers
        from gnq_core.attacks.exposure_fdr import RATIO_VALUES
        from gnq_core.attacks.exposure_relative import measure_kind
        from gnq_core.attacks.forward import evaluating
        from gnq_core.attacks.secret_exposure import prompt_of_value, relative_kinds
        from gnq_core.sources.surrogates import SurrogateError, surrogate

        relative = relative_kinds(self.attack.occurrences(t))
        if not relative:
            return None
        settings = self.attack.exposure_settings(t)
        o = next(iter(relative.values()))[0]
        share = RATIO_VALUES // max(1, sum(map(len, relative.values())))
        rng = random.Random(settings.seed)
        never = []
        for _ in range(share):
            with contextlib.suppress(SurrogateError):
                never.append(surrogate(o.kind, o.value, rng, {o.value}))
        scorers = Scorers(settings.batch_size, settings.device)
        with evaluating(t.model):
            t0 = clock.now()
            measure_kind(t.model, t.model, t.tokenizer, [o], [prompt_of_value(o, settings.max_length)],
                         scorers, settings.n_candidates, [never], lambda i: settings.seed)
            return clock.now() - t0

    def line(self, work: Work, probe: Probe) -> Line:
        from gnq_core.attacks.secret_exposure import NULL_VALUES

        first = work.distinct_values * _models(work)
        each = probe.exposure_s or 0.0
        shared = probe.exposure_shared_s if probe.exposure_shared_s is not None else each
        null = work.formats * NULL_VALUES
        relative = work.get("relative_values") if work.reference else 0
        relative_s = probe.get("relative_s") or 0.0
        said = (f"{work.distinct_values} distinct value(s) × {_models(work)} model(s), each {each:.2f} s "
                f"(the run's own values, after their prompts), + {work.formats} format(s) "
                f"× {NULL_VALUES} never-trained values after their format's prompts, each "
                f"{shared:.2f} s (the prompt's search already done); measured in turn per format "
                "(a memorised value is ranked faster; a value whose search resumes to the full "
                "node budget, slower)")
        if relative:
            said += (f"; + {relative} e-mail, name, address or date-of-birth value(s) measured relative to "
                     f"the reference, each {relative_s:.2f} s (its reference draws and its share of the "
                     "kind's never-trained values)")
        return Line(self.key, "secret values' exposure (with the null)",
                    first + null + relative + work.get("relative_kinds") * NULL_VALUES * bool(relative),
                    SECRET_VALUES, first * each + null * shared + relative * relative_s, said)
