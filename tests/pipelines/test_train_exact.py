"""`gnq train` (``run_training``) forms the weight gradient on the fused path: its stored in-run
GNQ equals explicit per-example gradients (float64) and its steps equal autograd's own."""

from __future__ import annotations

import functools

import pandas as pd
import pytest
import torch
from conftest import rel_err
from lm_fixtures import texts

from gnq_core.common.runtime import seed_everything
from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients
from gnq_core.engine.passes.micro import MicroAuditor
from gnq_core.pipelines import train as train_module
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.pipelines.training_loop import Callback, seeded_batches, train
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.models import build_model
from gnq_core.sources.tokens import batch_partition, collate, encode_texts, pad_id

SETTINGS = TrainSettings(lam=0.05, batch_size=4, max_length=16, epochs=2, lr=1e-2, dtype="float64",
                         vocab_size=300, seed=3)


def _train(tmp_path, name: str, monkeypatch=None, fused: bool = True):
    if not fused:  # what the run did before the fused path: autograd's own weight gradients
        monkeypatch.setattr(train_module, "GNQAuditor", functools.partial(_unfused_auditor))
    data = tmp_path / "texts.csv"
    if not data.exists():
        pd.DataFrame({"text": list(texts(10))}).to_csv(data, index=False)
    dataset = load_texts(data, "text")
    store = Store(tmp_path / f"{name}.duckdb")
    run = train_module.run_training(store, dataset, tmp_path / name, name=name, settings=SETTINGS)
    return dataset, run, store.scores(run.run_id), store.runs()


def _unfused_auditor(model, lam, fused, **options):  # options: lam_mode
    return GNQAuditor(model, lam=lam, fused=False, **options)


def test_first_step_gnq_equals_explicit_per_example_gradients(tmp_path, monkeypatch):
    fused_calls = []
    real = MicroAuditor._fused_call  # the class GNQAuditor builds for a training step
    monkeypatch.setattr(MicroAuditor, "_fused_call", lambda self, *a: fused_calls.append(1) or real(self, *a))
    dataset, run, scores, _ = _train(tmp_path, "fused")
    assert fused_calls  # the steps really went the fused way
    seed_everything(SETTINGS.seed)  # the model the run started from, built as the run built it
    model, tokenizer, _ = train_module._initial_model(dataset, None, SETTINGS)
    model.to(torch.float64)
    ids = encode_texts(tokenizer, dataset.texts, SETTINGS.max_length)
    first = batch_partition(len(ids), SETTINGS.batch_size, SETTINGS.seed)[0]
    b = collate([ids[i] for i in first], first, pad_id(tokenizer))
    model.train()
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    losses = per_example_lm_loss(logits, b.labels)
    expected = loo_gnq(per_example_gradients(losses, [p for p in model.parameters() if p.requires_grad]),
                       SETTINGS.lam)
    stored = scores.query("point == 0").set_index("example_id").loc[list(first), "gnq"]
    assert rel_err(torch.tensor(stored.to_numpy()), expected) < 1e-9
    assert "fused" in run.settings["weight_gradients"]


def test_fused_steps_equal_autograd_steps(tmp_path, monkeypatch):
    _, _, fused_scores, _ = _train(tmp_path, "fused")
    _, _, plain_scores, _ = _train(tmp_path, "plain", monkeypatch, fused=False)
    assert len(fused_scores) == 2 * 10
    assert rel_err(torch.tensor(fused_scores["gnq"].to_numpy()),
                   torch.tensor(plain_scores["gnq"].to_numpy())) < 1e-8
    a, _ = load_checkpoint(tmp_path / "fused" / "epoch-2")
    b, _ = load_checkpoint(tmp_path / "plain" / "epoch-2")
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(p.double(), q.double(), rtol=1e-8, atol=1e-11), name


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_loop_without_gnq_takes_the_steps_of_gnq_train(tmp_path):
    """The studies' pretraining and counterfactual models train through the same loop without the
    GNQ callback: from the model ``gnq train`` starts from, the same weights after its epochs."""
    dataset, _, _, _ = _train(tmp_path, "fused")
    seed_everything(SETTINGS.seed)
    model, tokenizer, _ = train_module._initial_model(dataset, None, SETTINGS)
    model.to(torch.float64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SETTINGS.lr, weight_decay=SETTINGS.weight_decay)
    ids = encode_texts(tokenizer, dataset.texts, SETTINGS.max_length)
    events = []

    class Record(Callback):
        def epoch_begin(self, epoch):
            events.append(("begin", epoch.number, len(epoch.batches)))

        def step_end(self, step):
            events.append(("step", step.number, tuple(step.example_ids)))

        def epoch_end(self, epoch):
            events.append(("end", epoch.number, epoch.checkpoint))

    train(model, optimizer, ids, pad_id(tokenizer), torch.device("cpu"),
          seeded_batches(range(len(ids)), SETTINGS.batch_size, SETTINGS.seed), epochs=range(SETTINGS.epochs),
          callbacks=[Record()])
    gnq_train, _ = load_checkpoint(tmp_path / "fused" / "epoch-2")
    for (name, p), q in zip(model.named_parameters(), gnq_train.parameters(), strict=True):
        assert torch.allclose(p, q.double(), rtol=1e-8, atol=1e-11), name
    batches = [batch_partition(len(ids), SETTINGS.batch_size, SETTINGS.seed + e) for e in range(2)]
    assert events == [("begin", 0, 3), *[("step", k + 1, tuple(b)) for k, b in enumerate(batches[0])],
                      ("end", 0, None), ("begin", 1, 3),
                      *[("step", k + 4, tuple(b)) for k, b in enumerate(batches[1])], ("end", 1, None)]


def test_a_callback_vetoing_every_step_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=50, max_length=8, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-1)

    class Veto(Callback):
        def after_backward(self, step):
            assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
            step.skip = True

    ids = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    train(model, optimizer, ids, 0, torch.device("cpu"), seeded_batches(range(3), 2, 0), epochs=range(2),
          callbacks=[Veto()])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())  # zeroed after every step, stepped or not
