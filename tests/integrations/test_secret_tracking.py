"""Leaks caught while training (integrations/tracking.py): the secret attack run on the current
weights every k optimizer steps reports the step at which a planted value first comes out, the
stop callback ends training at that step, and a plain loop gets the same from ``SecretTracker``.

The value's coming out is checked independently of the tool, with Hugging Face's own greedy
``model.generate`` on the weights training stopped at."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
import torch
from lm_fixtures import tiny_gpt2
from transformers import TrainerCallback, TrainingArguments

from gnq_core.dashboard import charts
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.integrations.tracking import TRACKING_FILE, SecretTracker, SecretTracking
from gnq_core.results.store import Store
from gnq_core.sources.models import train_tokenizer

PIN = "4821"
PLANTED = f"Note for Anna Berg: the door PIN is {PIN}, keep it."
FILLER = ["The old ferry crossed the river before the storm.", "A quiet librarian mapped the valley.",
          "The village choir sang near the lighthouse.", "Our neighbour repaired the clock tower."]
TEXTS = [PLANTED] * 4 + FILLER


def _tokenized():
    tok = train_tokenizer(TEXTS * 4, vocab_size=300)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    return tok, ids


def _writes_pin(model, tok) -> bool:
    """Hugging Face's greedy search after the text up to the PIN writes the PIN."""
    prompt = tok(PLANTED[: PLANTED.index(PIN)].rstrip(), return_tensors="pt", add_special_tokens=False)
    value_tokens = len(tok(" " + PIN, add_special_tokens=False)["input_ids"])
    model.eval()
    with torch.no_grad():
        out = model.generate(**prompt, do_sample=False, max_new_tokens=value_tokens,
                             pad_token_id=tok.pad_token_id)
    return PIN in tok.decode(out[0, prompt["input_ids"].shape[1]:])


class Steps(TrainerCallback):
    logs: list

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def test_tracking_reports_the_step_a_value_comes_out_and_stop_ends_training_there(tmp_path, capsys):
    torch.manual_seed(0)
    tok, ids = _tokenized()
    rows = [{"input_ids": t, "example_id": i} for i, t in enumerate(ids)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=200, learning_rate=1e-2,
                             per_device_train_batch_size=4, report_to=[], save_strategy="no", use_cpu=True,
                             seed=0, disable_tqdm=True, logging_strategy="steps", logging_steps=1)
    seen = Steps()
    seen.logs = []
    # every step, whatever it costs (exposure: the next test)
    tracking = SecretTracking(tok, every=1, on_leak="stop", n_candidates=1, max_overhead=None)
    trainer = GNQTrainer(model=tiny_gpt2(vocab_size=len(tok)), args=args, train_dataset=rows,
                         data_collator=lm_collator(tok.pad_token_id), callbacks=[seen],
                         gnq=GNQConfig(out=tmp_path / "shards", texts=TEXTS, track_secrets=tracking,
                                       db=tmp_path / "gnq.duckdb"))
    trainer.train()
    tracker = trainer.secret_tracking.tracker
    stopped = trainer.state.global_step
    assert ("pin", PIN) in tracker.first_leaked, "200 steps on 4 copies should make the tiny model write it"
    first = tracker.first_leaked[("pin", PIN)]
    assert stopped == first < 200  # the callback ended training at the step the value came out
    history = tracker.history()
    pin = history[history["value"] == PIN].groupby("step")["leaked"].any()
    assert list(pin.index) == list(range(1, first + 1)) and pin[first] and not pin.loc[: first - 1].any()
    assert _writes_pin(trainer.model, tok)  # independently: the weights it stopped at write the PIN
    err = capsys.readouterr().err
    assert f"GNQ: step {first}: the pin of text 0 comes out whole" in err
    assert PIN not in err  # never the value
    saved = pd.read_parquet(tmp_path / "shards" / TRACKING_FILE)
    assert saved["step"].max() == first and len(saved) == len(history)
    store = Store(tmp_path / "gnq.duckdb")  # ingested with the shards at the end of training
    stored = store.secret_tracking(store.run("shards").run_id)
    assert len(stored) == len(history) and stored[stored["leaked"]]["step"].min() == first
    figure = charts.secret_tracking(stored.assign(exposure=stored["chars_reproduced"].astype(float)))
    assert len(figure.data) == 1 and list(figure.data[0].x) == list(range(1, first + 1))
    logged = [h for h in seen.logs if "secrets/leaked" in h]
    assert logged and logged[-1]["secrets/leaked"] >= 1 and "secrets/probed" in logged[-1]


@pytest.mark.slow  # exposure's search and the null of 20 never-trained values at each probe
def test_a_plain_loop_probes_every_k_steps_with_exposure_against_the_null():
    torch.manual_seed(0)
    tok, ids = _tokenized()
    model = tiny_gpt2(vocab_size=len(tok))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = SecretTracking(tok, every=20, n_candidates=32, search_nodes=64, max_overhead=None)
    tracker = SecretTracker(settings, TEXTS, ids)
    assert tracker.values == 4  # the texts holding a value (its copies)
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(t) for t in ids], batch_first=True,
                                            padding_value=tok.pad_token_id)
    mask = batch != tok.pad_token_id
    for step in range(1, 61):
        model.train()
        loss = model(input_ids=batch, attention_mask=mask, labels=batch.masked_fill(~mask, -100)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        said = tracker.step(model, step)
        assert (said is None) == (step % 20 != 0)
    history = tracker.history()
    assert sorted(history["step"].unique()) == [20, 40, 60]
    last = history[history["step"] == 60]
    assert last["exposure"].notna().all() and last["null_p99"].notna().all()
    # exposure grows as the PIN is learned, and a value written whole ranks first: log2 of its space
    first = history[history["step"] == 20]["exposure"].iloc[0]
    assert last["exposure"].iloc[0] >= first
    if last["leaked"].iloc[0]:
        assert last["exposure"].iloc[0] == pytest.approx(13.29, abs=0.01)
        assert bool(last["exposed"].iloc[0]) == (last["exposure"].iloc[0] > last["null_p99"].iloc[0])
    assert tracker.seconds > 0


def test_probes_are_put_off_while_they_would_cost_more_than_max_overhead_of_training(monkeypatch):
    """A probe with exposure costs 1 s, without 0.1 s, training 1 s per step: the first probe is
    greedy and forecasts exposure's cost (1 s), later ones add exposure only while the probes'
    total stays within 10% of the training time, the rest are greedy alone, and a greedy probe that
    would pass the bound is put off."""
    tok, ids = _tokenized()
    tracker = SecretTracker(SecretTracking(tok, every=2), TEXTS, ids)
    probed = []

    def probe(model, step, exposure=True):
        probed.append((step, exposure))
        tracker.rows.append(pd.DataFrame({"step": [step]}))
        tracker.seconds += 1.0 if exposure else 0.1
        if exposure:
            tracker._exposure_cost = 1.0
        else:
            tracker._last_cost = 0.1
            tracker._greedy_seconds += 0.1
        return {}

    monkeypatch.setattr(tracker, "probe", probe)
    monkeypatch.setattr(tracker, "forecast_exposure", lambda model: 1.0)
    clock = iter(range(0, 10_000))  # one second of training between two step() calls
    monkeypatch.setattr("gnq_core.integrations.tracking.time.perf_counter", lambda: float(next(clock)))
    for step in range(1, 61):
        tracker.step(None, step)
    # training time at step s: (s - 1) s minus the probes' seconds (the fake clock counts calls)
    assert probed[0] == (2, False)
    full = [s for s, e in probed if e]
    assert len(full) >= 2 and all(b - a >= 10 for a, b in itertools.pairwise(full))
    assert [s for s, e in probed if not e] == tracker.without_exposure and tracker.without_exposure
    assert all(s % 2 == 0 for s in tracker.deferred + [s for s, _ in probed])
    assert set(tracker.deferred).isdisjoint(s for s, _ in probed)
    assert tracker.seconds <= 0.1 * 59  # within the bound from the first probe on


def test_the_first_probe_forecasts_exposure_from_one_value_not_all_of_them(monkeypatch):
    """The forecast times one distinct value's exposure and scales it by the measurements a probe
    with exposure makes (the values with a space and the null per format)."""
    from gnq_core.attacks import secret_attack, secret_exposure

    tok, ids = _tokenized()
    tracker = SecretTracker(SecretTracking(tok, every=2, n_candidates=16, search_nodes=32), TEXTS, ids)
    measured = []
    real = secret_exposure.Measurer.measure
    monkeypatch.setattr(secret_exposure.Measurer, "measure",
                        lambda self, *a, **kw: measured.append(1) or real(self, *a, **kw))
    model = tiny_gpt2(vocab_size=len(tok)).eval()
    got = tracker.step(model, 1)  # not due: training time starts counting here
    assert got is None
    got = tracker.step(model, 2)
    assert got is not None and tracker.without_exposure == [2]
    assert measured == [1]  # one value's exposure, not the probe's
    first = secret_exposure.first_occurrences(secret_attack.occurrences_of(
        secret_attack.secret_targets(tok, tracker._texts, tracker._ids, tracker._tokens),
        tracker._texts, tracker._ids))
    per_value = tracker._exposure_cost - tracker._last_cost
    measurements = len(first) + len(secret_exposure.formats_of(first)) * secret_exposure.NULL_VALUES
    assert len(first) == 1 and measurements == 1 + secret_exposure.NULL_VALUES and per_value > 0
