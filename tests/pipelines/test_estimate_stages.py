"""The estimate is made of the jobs' own stages (attacks/stage_cost.py): every stored attack and
the audit declare theirs, a stage added to a job kind is counted, timed and shown without a line
of the estimate changing, and the probe runs each stage's own code, not a copy of it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pandas as pd
import pytest

from gnq_core.attacks.stage_cost import Line, Probe, Work
from gnq_core.common.progress import TEXTS
from gnq_core.pipelines import estimate_probe
from gnq_core.pipelines.estimate_probe import estimate_lines, job_stages, measure_estimate, stage_of
from gnq_core.sources import load_texts, save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

TEXTS_OF_THE_PROBE = [
    *(f"Note {i} for the team: the door PIN is {1000 + 37 * i:04d}, keep it safe and never share it."
      for i in range(4)),
    *(f"A plain sentence number {i} about the weather, the river and the old stone bridge."
      for i in range(4)),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    tokenizer = train_tokenizer(TEXTS_OF_THE_PROBE, vocab_size=300)
    save_checkpoint(build_model("tiny", len(tokenizer), 48, seed=1), tokenizer, root / "epoch-1")
    pd.DataFrame({"text": TEXTS_OF_THE_PROBE}).to_csv(root / "data.csv", index=False)
    return root


@dataclass(frozen=True)
class Echoes:
    """A stage a new attack might bring: counts the texts holding "PIN", times a unit of its own."""

    key: str = "echoes"
    label: re.Pattern[str] = re.compile(r"^echoes of ")

    def count(self, t, scale: float) -> dict[str, int]:
        texts = t.dataset.texts if hasattr(t, "dataset") else t.texts  # the audit's inputs, or a Target
        return {"pin_texts": round(sum("PIN" in text for text in texts) * scale)}

    def measure(self, t, clock) -> dict[str, float | None]:
        return {"echo_s": 0.25 + 0.0 * clock.timed(lambda: None)}

    def line(self, work: Work, probe: Probe) -> Line:
        n = work.get("pin_texts")
        return Line(self.key, "echoes", n, TEXTS, n * probe.get("echo_s"), f"{n} × {probe.get('echo_s')} s")


@dataclass
class EchoAttack:
    name: str = "echoes"
    stages: tuple = (Echoes(),)


@pytest.fixture(params=["extract", "audit"])
def with_an_echo_attack(request, monkeypatch):
    """A job kind with one more stage: the attack's (a new stored attack) or the audit's."""
    import gnq_core.attacks.stored as stored
    import gnq_core.pipelines.audit_stage as audit_stage

    if request.param == "extract":
        real = stored.stored_attacks
        monkeypatch.setattr(stored, "stored_attacks", lambda *a, **kw: [*real(*a, **kw), EchoAttack()])
    else:
        own = audit_stage.audit_stages
        monkeypatch.setattr(audit_stage, "audit_stages", lambda: [*own(), Echoes()])
    estimate_probe._stage_labels.cache_clear()
    yield request.param
    estimate_probe._stage_labels.cache_clear()


@pytest.mark.parametrize(("calibrated", "suffix", "candidates"), [(True, 8, 20), (False, None, 1)])
def test_every_stored_attack_declares_the_stages_its_run_reports(calibrated, suffix, candidates):
    """Each attack ``gnq extract`` runs lists its stages; every stage has a key of its own, a label
    pattern, and counts, measures and gives its line; the stage list follows the attack list."""
    from gnq_core.attacks.stored import stored_attacks

    attacks = stored_attacks(12, 1.0, suffix, calibrated, candidates)
    stages = [s for a in attacks for s in a.stages]
    keys = [s.key for s in stages]
    assert len(set(keys)) == len(keys)
    assert all(isinstance(s.label, re.Pattern) and callable(s.count) and callable(s.measure)
               and callable(s.line) for s in stages)
    work = Work(texts=10, checkpoints=1, batch_size=4, reference=calibrated, suffix=suffix,
                secret_candidates=candidates)
    assert [s.key for s in job_stages(work)] == ["audit", *keys]
    expected = {"attack", "secret decode"} | ({"membership"} if calibrated else set()) \
        | ({"discoverable"} if suffix else set()) | ({"exposure"} if candidates > 1 else set())
    assert set(keys) == expected
    probe = Probe(load_s=1.0, audit_batch_s=1.0, decode_s=1.0, forward_s=1.0, exposure_s=1.0, threads=1,
                  model="m")
    assert [x.stage for x in estimate_lines(work, probe)] == ["audit", *keys]


def test_the_stage_labels_are_the_stages_own(with_an_echo_attack):
    assert stage_of("echoes of epoch-3") == "echoes" and stage_of("epoch-3") == "audit"
    assert stage_of("attack epoch-3 and reference epoch-1 (p=12)") == "attack"
    assert set(estimate_probe.STAGE_LABELS) == {"attack", "membership", "discoverable", "secret decode",
                                                "exposure", "echoes"}


def test_a_stage_added_to_a_job_kind_is_counted_timed_and_shown(job, with_an_echo_attack):
    """The estimate module names no stage: a new attack's stage gets its counts and unit costs
    (beyond Work's and Probe's named fields) and its line."""
    work, probe = measure_estimate(str(job / "epoch-1"), load_texts(job / "data.csv"), batch_size=4,
                                   max_length=48, secret_candidates=1, reference=False)
    assert work.counts == {"pin_texts": 4} and probe.units == {"echo_s": 0.25}
    lines = {x.stage: x for x in estimate_lines(work, probe)}
    assert lines["echoes"].count == 4 and lines["echoes"].seconds == pytest.approx(1.0)
    attack = ["attack", "discoverable", "secret decode"]
    assert list(lines) == (["audit", *attack, "echoes"] if with_an_echo_attack == "extract"
                           else ["audit", "echoes", *attack])


def test_the_probe_runs_each_stages_own_code(job, monkeypatch):
    """Each unit the probe times is the job's own function (spied on here): the audit's batches,
    the text attack's decoding, the membership and discoverable passes, the secret values'
    decoding and their exposures; the counts are those the stages' own selection gives."""
    import gnq_core.attacks.discoverable as discoverable
    import gnq_core.attacks.extraction as extraction
    import gnq_core.attacks.membership as membership
    import gnq_core.attacks.secret_attack as secret_attack
    import gnq_core.attacks.secret_exposure as secret_exposure
    import gnq_core.pipelines.audit as audit

    called: dict[str, int] = {}

    def spy(module, name):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            called[name] = called.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)

    for module, name in [(audit, "audit_batches"), (extraction, "extraction_attack"),
                         (membership, "token_logprobs"), (discoverable, "suffix_logprob"),
                         (secret_attack, "decode_values"), (extraction, "attackable")]:
        spy(module, name)
    spy(secret_exposure.Measurer, "measure")
    dataset = load_texts(job / "data.csv")
    work, probe = measure_estimate(str(job / "epoch-1"), dataset, batch_size=4, max_length=48,
                                   secret_candidates=8, exposure_nodes=8)
    assert set(called) == {"audit_batches", "extraction_attack", "token_logprobs", "suffix_logprob",
                           "decode_values", "attackable", "measure"}, called
    # the attack's own selection (the notes' shared opening is boilerplate: no window in it; a PIN
    # whose every digit the run's template explains has no exposure space): counted, not assumed
    assert 0 < work.attackable < len(dataset) and work.secret_values == 4 and work.formats == 1
    assert probe.exposure_s and probe.exposure_shared_s and probe.suffix_forward_s and probe.decode_s


def test_values_measured_relative_to_the_reference_are_counted_timed_and_shown(tmp_path, monkeypatch):
    """E-mail addresses (no uniform space) are measured against the reference model
    (attacks/exposure_relative.py): the estimate counts them, times one with its own code
    (``measure_kind``, spied on) and adds them to the exposure line."""
    import gnq_core.attacks.exposure_relative as exposure_relative

    texts = [f"Contact {name} at {name.lower()}.{i}@mailbox.org for the keys, not the front desk."
             for i, name in enumerate(["Anna", "Tom", "Lena", "Ravi"])]
    texts += [f"A plain sentence number {i} about the weather and the old stone bridge." for i in range(4)]
    tokenizer = train_tokenizer(texts, vocab_size=300)
    save_checkpoint(build_model("tiny", len(tokenizer), 48, seed=1), tokenizer, tmp_path / "epoch-1")
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "data.csv", index=False)
    called = []
    real = exposure_relative.measure_kind
    monkeypatch.setattr(exposure_relative, "measure_kind",
                        lambda *a, **kw: called.append(1) or real(*a, **kw))
    work, probe = measure_estimate(str(tmp_path / "epoch-1"), load_texts(tmp_path / "data.csv"), batch_size=4,
                                   max_length=48, secret_candidates=8, exposure_nodes=8)
    assert called and work.get("relative_values") == 4 and work.get("relative_kinds") == 1
    assert probe.get("relative_s") > 0
    line = {x.stage: x for x in estimate_lines(work, probe)}["exposure"]
    assert "4 e-mail, name, address or date-of-birth value(s) measured relative" in line.assumed
    uncalibrated = dataclasses.replace(work, reference=False)
    alone = {x.stage: x for x in estimate_lines(uncalibrated, probe)}.get("exposure")
    assert alone is None or "relative to the reference" not in alone.assumed
