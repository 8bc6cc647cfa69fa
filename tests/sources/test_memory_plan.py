"""The memory plan an audit runs under (sources/memory_plan.py), made before anything loads: the
next checkpoint is not prefetched when two do not fit, the default batch is the largest that
fits, a batch that does not fit is refused in one line before any write, and an out-of-memory
error in a batch is one line naming the fix with the run left resumable.  And a bf16 checkpoint
audited as stored: its dtype recorded, its GNQ within the stated error of float64.

The plan's terms against measured peak RSS of real audits: benchmarks/model_memory.py (too slow
for the suite)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

import gnq_core.pipelines.audit as audit_module
from gnq_core.cli import app
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.precision import HALF_AUDIT_ERROR
from gnq_core.results.store import Store
from gnq_core.sources import memory_plan
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.memory_plan import model_shape, plan_for_batch
from gnq_core.sources.models import train_tokenizer

WORDS = [f"{a}{b}" for a in "bdfgklmnprst" for b in ("a", "e", "i", "o", "an", "el")]


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Path:
    """Two checkpoints of a tiny Llama saved in bfloat16 (as most published models are)."""
    root = tmp_path_factory.mktemp("plan") / "series"
    tok = train_tokenizer(_texts(200, seed=1), vocab_size=300)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    for i in range(2):
        torch.manual_seed(i)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(root / f"checkpoint-{i + 1}")
        tok.save_pretrained(root / f"checkpoint-{i + 1}")
    return root


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(_texts(8)) + "\n", encoding="utf-8")
    return path


def _room(monkeypatch, room: int) -> None:
    monkeypatch.setattr(memory_plan, "_room", lambda device: (room, "the test's memory", 0))


def _plan(series: Path, batch: int, prefetch: bool, dtype: str = "bfloat16"):
    return plan_for_batch(model_shape(series / "checkpoint-1"), batch_size=batch, max_length=32, dtype=dtype,
                          checkpoints=2, device="cpu", room=2**62, room_source="-", prefetch=prefetch)


def test_the_plan_counts_weights_in_the_compute_dtype_and_the_prefetch_only_when_two_fit(series):
    shape = model_shape(series / "checkpoint-1")
    assert shape.stored_dtype == "bfloat16"
    one, two = _plan(series, 4, prefetch=False), _plan(series, 4, prefetch=True)
    terms = {t.name: t.bytes for t in two.terms}
    assert terms["weights"] == shape.parameters * 2 and terms["loading"] == 0  # bf16 as stored: no copy
    upcast = {t.name: t.bytes for t in _plan(series, 4, prefetch=True, dtype="float32").terms}
    assert upcast["weights"] == shape.parameters * 4 and upcast["loading"] == shape.file_bytes
    assert two.peak - one.peak == terms["next checkpoint"] == terms["weights"]
    # logits: B × T × vocabulary in the compute dtype, and their gradient among the copies
    assert terms["logits"] >= 2 * 4 * 32 * shape.vocab * 2
    room = (one.peak + two.peak) // 2  # one fits, two do not
    same = dict(batch_size=4, max_length=32, dtype="bfloat16", checkpoints=2, device="cpu", room_source="-")
    planned = plan_for_batch(shape, room=room, **same)
    assert planned.fits and not planned.prefetch
    assert plan_for_batch(shape, room=two.peak, **same).prefetch


def test_the_audit_skips_the_prefetch_when_two_checkpoints_do_not_fit(series, data, tmp_path, monkeypatch):
    one, two = _plan(series, 4, prefetch=False), _plan(series, 4, prefetch=True)
    _room(monkeypatch, (one.peak + two.peak) // 2)
    started = []
    real = audit_module.Prefetch
    monkeypatch.setattr(audit_module, "Prefetch", lambda fn, arg: started.append(arg) or real(fn, arg))
    run = run_audit(Store(tmp_path / "gnq.duckdb"), series, load_texts(data), name="r",
                    settings=AuditSettings(batch_size=4, max_length=32, device="cpu"))
    assert run.status == "done" and started == []  # each checkpoint loaded after the one before
    _room(monkeypatch, two.peak * 2)
    run_audit(Store(tmp_path / "gnq2.duckdb"), series, load_texts(data), name="r",
              settings=AuditSettings(batch_size=4, max_length=32, device="cpu"))
    assert started == [1]  # with room for two, the second loads while the first is audited


def test_the_default_batch_is_the_largest_that_fits_and_is_recorded(series, data, tmp_path, monkeypatch):
    _room(monkeypatch, _plan(series, 3, prefetch=True).peak)
    run = run_audit(Store(tmp_path / "gnq.duckdb"), series, load_texts(data), name="r",
                    settings=AuditSettings(max_length=32, device="cpu"))
    assert run.batch_size == 3 and run.status == "done"
    first = series / "checkpoint-1"
    assert memory_plan.default_batch_size(first, max_length=32, checkpoints=2) == 3
    _room(monkeypatch, 2**40)
    assert memory_plan.default_batch_size(first, max_length=32) == memory_plan.DEFAULT_BATCH_CAP


def _argv(series: Path, data: Path, db: Path, *more: str) -> list[str]:
    return ["audit", "--checkpoints", str(series), "--data", str(data), "--db", str(db), "--max-length", "32",
            "--device", "cpu", "--quiet", *more]


def test_a_batch_that_does_not_fit_is_refused_in_one_line_before_any_write(series, data, tmp_path,
                                                                            monkeypatch):
    _room(monkeypatch, _plan(series, 3, prefetch=False).peak)
    db = tmp_path / "gnq.duckdb"
    out = CliRunner().invoke(app, _argv(series, data, db, "--batch-size", "8"))
    assert out.exit_code == 1, out.output
    assert len(out.output.strip().splitlines()) == 1
    assert "--batch-size 8 needs" in out.output and "--batch-size 3 fits" in out.output
    assert not db.exists() or Store(db).find_run("series") is None
    _room(monkeypatch, _plan(series, 2, prefetch=False).peak - 1)  # not even the smallest batch
    out = CliRunner().invoke(app, _argv(series, data, db))
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1
    assert "even at --batch-size 2" in out.output and "--max-length" in out.output
    assert not db.exists() or Store(db).find_run("series") is None


CPU_OOM = RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you "
                       "tried to allocate 1073741824 bytes")


GPU_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("error", [CPU_OOM, GPU_OOM])
def test_out_of_memory_in_a_batch_is_one_line_and_the_run_resumes(series, data, tmp_path, monkeypatch, error):
    calls = {"n": 0}
    real = audit_module.per_example_lm_loss

    def loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the second checkpoint's first batch (two batches a checkpoint)
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(audit_module, "per_example_lm_loss", loss)
    db = tmp_path / "gnq.duckdb"
    argv = _argv(series, data, db, "--batch-size", "4")
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 1, out.output
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output
    assert "checkpoint-2: out of memory at --batch-size 4" in out.output and "--batch-size 2" in out.output
    store = Store(db)
    run = store.find_run("series")
    assert run.status == "failed"
    assert list(store.points(run.run_id).query("status == 'done'")["point"]) == [0]
    calls["n"] = -10**9  # the memory is there now: the same command resumes
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 0, out.output
    run = Store(db).find_run("series")
    assert run.status == "done" and len(Store(db).scores(run.run_id)) == 16


def test_a_bf16_checkpoint_is_audited_as_stored_within_its_stated_error(series, data, tmp_path):
    store = Store(tmp_path / "gnq.duckdb")
    texts = load_texts(data)
    half = run_audit(store, series / "checkpoint-1", texts, name="half",
                     settings=AuditSettings(batch_size=4, max_length=32, device="cpu"))
    exact = run_audit(store, series / "checkpoint-1", texts, name="exact",
                      settings=AuditSettings(batch_size=4, max_length=32, device="cpu", dtype="float64"))
    assert half.dtype == "bfloat16" and half.settings["source_dtype"] == "bfloat16"
    assert half.settings["precision"].startswith("approximate")
    assert exact.dtype == "float64" and "upcast" in exact.settings["precision"]
    a = store.scores(half.run_id).sort_values("example_id")["gnq"].to_numpy()
    b = store.scores(exact.run_id).sort_values("example_id")["gnq"].to_numpy()
    assert np.isfinite(a).all() and not np.allclose(a, b, rtol=1e-7, atol=0)  # really computed in bf16
    assert np.abs(a - b).max() / np.abs(b).max() <= HALF_AUDIT_ERROR


def test_under_a_ulimit_v_below_the_need_the_audit_is_refused_before_loading(series, data, tmp_path,
                                                                              monkeypatch):
    """The room under ``ulimit -v`` (RLIMIT_AS) is what the address space has left: none here, so no
    batch size fits whatever the plan's estimate of the smallest one (a margin such as 1 MB let the
    smallest batch of this tiny model fit on one machine and not on another)."""
    import resource

    import psutil

    from gnq_core.sources import limits

    def soft() -> int:  # read when asked: the address space grows as threads start (a worker, duckdb)
        return psutil.Process().memory_info().vms

    monkeypatch.setattr(limits.resource, "getrlimit",
                        lambda which: (soft(), resource.RLIM_INFINITY) if which == resource.RLIMIT_AS
                        else resource.getrlimit(which))
    db = tmp_path / "gnq.duckdb"
    out = CliRunner().invoke(app, _argv(series, data, db))
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1, out.output
    assert "room under ulimit -v" in out.output and "refused before loading" in out.output
    assert not db.exists() or Store(db).find_run("series") is None


# ------------------------------------------------------------------------------- PEFT adapters

LORA_RANK = 4
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def adapters(series) -> Path:
    """Two LoRA adapters (r 4 on every projection, dropout 0.05: TRL's usual recipe) of the series'
    first checkpoint, saved by PEFT as a Trainer's checkpoints are."""
    peft = pytest.importorskip("peft")
    root = series.parent / "adapters"
    for i in range(2):
        torch.manual_seed(10 + i)
        base = LlamaForCausalLM.from_pretrained(series / "checkpoint-1")
        config = peft.LoraConfig(r=LORA_RANK, lora_alpha=8, lora_dropout=0.05, target_modules=PROJECTIONS,
                                 init_lora_weights=False, task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # PEFT's own use of a name transformers deprecates
            warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            peft.get_peft_model(base, config).save_pretrained(root / f"checkpoint-{i + 1}")
    return root


def _probe_copies(model: torch.nn.Module, batch: int, length: int, monkeypatch) -> int:
    """Bytes the first batch's probe keeps of one audited forward (every module call's inputs and
    outputs of B+1 examples, engine.plan.planning), counted as it makes them."""
    from gnq_core.engine.auditor import GNQAuditor
    from gnq_core.engine.plan import planning

    kept = [0]
    real = planning._leaves

    def leaves(tree):
        out = real(tree)
        kept[0] += sum(x.nbytes for x in out if isinstance(x, torch.Tensor))
        return out

    monkeypatch.setattr(planning, "_leaves", leaves)
    ids = torch.randint(1, model.config.vocab_size, (batch, length),
                        generator=torch.Generator().manual_seed(0))
    with GNQAuditor(model, lam=1e-2, fused=False):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    monkeypatch.setattr(planning, "_leaves", real)
    return kept[0]


def test_the_plan_of_an_adapter_counts_its_layers_in_the_first_batchs_probe(series, adapters, monkeypatch):
    """PEFT wraps each adapted Linear: the probe of the first batch copies the wrapper's, its base
    layer's, the dropout's and LoRA's A and B calls, and the wrappers' logits, beyond what the base
    audited as a full model copies; the plan's adapter terms count them, from the headers alone."""
    from gnq_core.sources.adapters import Adapters, load_adapter_checkpoint
    from gnq_core.sources.checkpoints.load import load_checkpoint

    base, adapter = series / "checkpoint-1", adapters / "checkpoint-1"
    shape, peft_shape = model_shape(base), memory_plan.adapter_shape(adapter, base)
    model, _ = load_adapter_checkpoint(adapter, Adapters(base), dtype=torch.bfloat16)
    linears = {n: m for n, m in model.named_modules() if n.endswith(tuple(PROJECTIONS))}
    assert len(peft_shape.modules) == len(linears) == 7 * shape.layers
    assert sorted(peft_shape.modules) == sorted((m.in_features, m.out_features, LORA_RANK)
                                                for m in linears.values())
    assert peft_shape.parameters == sum(p.numel() for p in model.parameters() if p.requires_grad)

    def terms(batch: int, length: int, with_adapter: bool = True) -> dict[str, int]:
        plan = plan_for_batch(shape, batch_size=batch, max_length=length, dtype="bfloat16", checkpoints=2,
                              device="cpu", room=2**62, room_source="-", prefetch=True,
                              adapter=peft_shape if with_adapter else None)
        return {t.name: t.bytes for t in plan.terms}

    two, four, plain = terms(2, 16), terms(4, 16), terms(2, 16, with_adapter=False)
    assert two["adapter"] == peft_shape.parameters * 2  # bf16, as stored
    assert two["next checkpoint"] == plain["next checkpoint"] + two["adapter"]  # the base loads again
    assert {k: v for k, v in two.items() if k in plain} == plain | {"next checkpoint": two["next checkpoint"]}
    # the probe's second batch has B+1 examples; the copies are per token
    assert four["adapter layers"] * 3 == pytest.approx(two["adapter layers"] * 5, rel=1e-6)
    assert terms(2, 32)["adapter layers"] == pytest.approx(2 * two["adapter layers"], rel=1e-6)

    # what the probe really copies, the adapter against its base audited as a full model
    full, _ = load_checkpoint(base, dtype=torch.bfloat16)
    for p in full.parameters():
        p.requires_grad_(True)
    extra = _probe_copies(model, 2, 16, monkeypatch) - _probe_copies(full.eval(), 2, 16, monkeypatch)
    print(f"probe's copies beyond the base's {extra:,} bytes, planned {two['adapter layers']:,}")
    assert extra > 0
    assert extra <= two["adapter layers"] <= 1.5 * extra


def test_an_adapter_audit_takes_the_batch_its_plan_fits(series, adapters, data, tmp_path, monkeypatch):
    """The audit of unmerged adapters plans their layers beside the base's: in room for batch 3 of
    the adapter's plan (where the base's own plan fits a larger batch) the default batch is 3; a
    merged adapter is a base-shaped model, planned as one."""
    from gnq_core.sources.adapters import Adapters, find_adapter_checkpoints

    base, refs = series / "checkpoint-1", find_adapter_checkpoints(adapters)[:1]
    shape, peft_shape = model_shape(base), memory_plan.adapter_shape(refs[0].path, base)
    same = dict(max_length=32, dtype="bfloat16", checkpoints=1, device="cpu", room_source="-")
    room = plan_for_batch(shape, batch_size=3, room=2**62, adapter=peft_shape, **same).peak
    assert not plan_for_batch(shape, batch_size=4, room=room, adapter=peft_shape, **same).fits
    assert plan_for_batch(shape, batch_size=4, room=room, **same).fits  # the base alone: more than 3
    _room(monkeypatch, room)
    run = run_audit(Store(tmp_path / "gnq.duckdb"), refs, load_texts(data), name="lora",
                    settings=AuditSettings(max_length=32, device="cpu"), adapters=Adapters(base))
    assert run.status == "done" and run.batch_size == 3
    merged = run_audit(Store(tmp_path / "merged.duckdb"), refs, load_texts(data), name="merged",
                       settings=AuditSettings(max_length=32, device="cpu"),
                       adapters=Adapters(base, merged=True))
    assert merged.status == "done" and merged.batch_size >= 4
