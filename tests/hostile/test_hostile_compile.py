"""torch.compile is refused in every form, in one line, before a probe or a hook runs in a
compiled graph: a compiled ``forward`` set on the instance (transformers' docs' pattern) or the
class, and any form (a compiled wrapper, ``model.compile()``, a compiled forward, a compiled
training step) done after the auditor attached — these died in planning with
``AttributeError: 'NoneType' object has no attribute 'item'``."""

from __future__ import annotations

import pytest
import torch
from lm_fixtures import lm_batch, tiny_gpt2
from torch import nn

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.plan.compiled import CompiledModelError, check_not_compiled


def _step(run, batch) -> None:
    out = run(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    per_example_lm_loss(out.logits, batch["labels"]).sum().backward()


def _refused(info) -> None:
    message = str(info.value)
    assert "\n" not in message and "torch.compile" in message and "gnq audit" in message


def test_a_compiled_forward_set_on_the_instance_is_refused_when_attaching():
    model = tiny_gpt2()
    model.forward = torch.compile(model.forward)
    with pytest.raises(CompiledModelError) as info:
        GNQAuditor(model)
    _refused(info)
    assert "the model compiled" in str(info.value)


def test_a_compiled_forward_of_a_submodule_or_class_is_refused():
    model = tiny_gpt2()
    block = model.transformer.h[0]
    block.forward = torch.compile(block.forward)
    with pytest.raises(CompiledModelError, match=r"transformer\.h\.0 compiled"):
        GNQAuditor(model)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        @torch.compile
        def forward(self, x):
            return self.lin(x)

    with pytest.raises(CompiledModelError):
        check_not_compiled(nn.Sequential(Net()))


def test_torch_compiler_disable_is_not_a_compile():
    model = tiny_gpt2()
    model.transformer.h[0].mlp.forward = torch.compiler.disable(model.transformer.h[0].mlp.forward)
    check_not_compiled(model)


def _compile_wrapper(model):
    return torch.compile(model)


def _compile_in_place(model):
    model.compile()
    return model


def _compile_forward(model):
    model.forward = torch.compile(model.forward)
    return model


def _compile_a_layer(model):
    model.transformer.h[1].compile()
    return model


@pytest.mark.parametrize("compile_after", [_compile_wrapper, _compile_in_place, _compile_forward,
                                           _compile_a_layer])
def test_compiling_after_the_auditor_attached_is_refused_at_the_first_forward(compile_after):
    torch._dynamo.reset()
    model = tiny_gpt2()
    batch = lm_batch([5, 4, 3])
    with GNQAuditor(model, lam=1e-2), pytest.raises(CompiledModelError) as info:
        _step(compile_after(model), batch)
    _refused(info)
    assert "after the auditor attached" in str(info.value)


def test_a_compiled_training_step_around_an_audited_model_is_refused():
    torch._dynamo.reset()
    model = tiny_gpt2()
    batch = lm_batch([5, 4, 3])
    with GNQAuditor(model, lam=1e-2), pytest.raises(CompiledModelError) as info:
        torch.compile(_step)(model, batch)
    _refused(info)


def test_an_eager_model_is_still_audited_after_a_refusal_elsewhere():
    model = tiny_gpt2()
    batch = lm_batch([5, 4, 3])
    with GNQAuditor(model, lam=1e-2) as auditor:
        _step(model, batch)
        assert torch.isfinite(auditor.compute().gnq).all()
