"""Settings are checked when they are built: every value of GNQConfig (and of the auditors and
SketchSpec it builds) that cannot work is one ValueError line naming the setting and its allowed
range at construction, not a ZeroDivisionError after the first step with a shards folder that
cannot be reused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from lm_fixtures import tiny_gpt2

from gnq_core import GNQAuditor
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.integrations.hf import GNQConfig

BAD_CONFIG = [
    ("flush_every", 0, "flush_every"), ("flush_every", -1, "flush_every"),
    ("flush_every", 2.5, "flush_every"), ("flush_every", True, "flush_every"),
    ("window_budget", -5, "window_budget"),
    ("window_budget", 0, "window_budget"), ("window_budget", "1GB", "window_budget"),
    ("lam", 0.0, "lam"), ("lam", -1.0, "lam"), ("lam", math.nan, "lam"), ("lam", math.inf, "lam"),
    ("lam", "0.01", "lam"), ("scope", "world", "scope"), ("strategy", "fastest", "strategy"),
    ("gnq_batch", "epoch", "gnq_batch"), ("window_mode", "approx", "window_mode"),
    ("max_length", 0, "max_length"), ("log_top", -1, "log_top"), ("flag_gnq", math.nan, "flag_gnq"),
    ("check_uses", "no", "check_uses"), ("fused", 1, "fused"), ("sketch", {"k": 8}, "sketch"),
    ("name", "", "name"), ("texts", "one text", "texts"), ("db", 5, "db"), ("out", None, "out"),
]


@pytest.mark.parametrize(("field", "value", "named"), BAD_CONFIG)
def test_every_bad_config_value_is_one_line_at_construction(tmp_path, field, value, named):
    kwargs = {"out": tmp_path / "shards", field: value}
    with pytest.raises(ValueError, match=named) as info:
        GNQConfig(**kwargs)
    assert "\n" not in str(info.value) and str(info.value).startswith("GNQConfig ")
    assert not (tmp_path / "shards").exists()


def test_good_values_still_build(tmp_path):
    config = GNQConfig(out=str(tmp_path / "s"), lam=np.float32(0.5), flush_every=np.int64(3), max_length=64,
                       flag_gnq=-2.0, log_top=0, window_budget=2**40, texts={7: "a"}, groups=("g",),
                       sketch=SketchSpec(k=16))
    assert config.scope == "global" and config.flush_every == 3


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"lam": math.inf}, "lam"), ({"lam": math.nan}, "lam"), ({"memory_budget": 0}, "memory_budget"),
    ({"check_uses": "yes"}, "check_uses")])
def test_the_auditor_checks_its_settings_before_any_hook(kwargs, named):
    model = tiny_gpt2()
    with pytest.raises(ValueError, match=named):
        GNQAuditor(model, **kwargs)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"window_budget": -5}, "window_budget"), ({"window_budget": 0}, "window_budget"),
    ({"sketch": 4096}, "sketch")])
def test_the_window_auditor_checks_its_budget_at_construction(kwargs, named):
    model = tiny_gpt2()
    with pytest.raises(ValueError, match=named):
        GNQAuditor(model, 1e-2, batch="step", **kwargs)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("field", ["k", "vocab_rows", "block"])
def test_sketch_spec_refuses_a_bool(field):
    with pytest.raises(ValueError, match=field):
        SketchSpec(**{field: True})


def test_flush_every_zero_no_longer_fails_after_the_first_step(tmp_path):
    """The probe: GNQConfig(flush_every=0) built, a Trainer trained one step, then a
    ZeroDivisionError left a shards folder that refuses reuse; now nothing is built or written."""
    from transformers import TrainingArguments

    from gnq_core.integrations.hf import GNQTrainer, lm_collator

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, max_steps=1,
                             per_device_train_batch_size=2, save_strategy="no", disable_tqdm=True)
    rows = [{"input_ids": [2, 3, 4, 5], "example_id": i} for i in range(4)]
    with pytest.raises(ValueError, match="flush_every"):
        GNQTrainer(model=tiny_gpt2(), args=args, train_dataset=rows, data_collator=lm_collator(0),
                   gnq=GNQConfig(out=tmp_path / "shards", flush_every=0))
    assert not (tmp_path / "shards").exists()
