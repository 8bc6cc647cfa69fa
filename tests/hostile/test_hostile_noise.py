"""Library noise: our calls use the APIs the installed libraries keep (the forward's ``cache``
argument, not the ``past_key_values`` transformers deprecates for 5.40), and a deprecation that a
library raises only inside its own code (PEFT reading ``is_gradient_checkpointing``) is silenced at
our call to it; so nothing reaches stderr under ``--quiet``.  The suite's own guard
(tests/own_warnings.py, installed by conftest) fails any test in which our code calls a deprecated
API; its last test shows the guard catches a real one and leaves a test's own call alone."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from lm_fixtures import texts, tiny_gpt2, tiny_llama

from gnq_core.attacks.decode import cache_argument, greedy_decode

ROOT = Path(__file__).resolve().parents[2]


def _deprecations(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DeprecationWarning | FutureWarning)]


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_greedy_decoding_uses_the_current_cache_api(make):
    torch.manual_seed(0)
    model = make().eval()
    assert cache_argument(model) == "cache"  # transformers ≥ 5.24: past_key_values is deprecated
    with warnings.catch_warnings(record=True) as record, torch.inference_mode():
        warnings.simplefilter("always")
        got = greedy_decode(model, [[3, 4, 5, 6], [7, 8]], 4, 0)
    assert _deprecations(record) == []
    # the cache is really used: the same ids as recomputing the unpadded prompt at every step
    for prompt, new in zip([[3, 4, 5, 6], [7, 8]], got, strict=True):
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(4):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(prompt):] == new


def test_loading_an_adapter_raises_no_deprecation(tmp_path):
    peft = pytest.importorskip("peft")
    from gnq_core.sources.adapters import Adapters, check_adapter, load_adapter_checkpoint
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import train_tokenizer

    tok = train_tokenizer(list(texts()), vocab_size=320)
    base = tiny_llama(vocab_size=len(tok))
    save_checkpoint(base, tok, tmp_path / "base")
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    with warnings.catch_warnings():  # the test's own call to PEFT is not what is checked
        warnings.simplefilter("ignore")
        peft.get_peft_model(copy.deepcopy(base), config).save_pretrained(tmp_path / "adapter")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        check_adapter(tmp_path / "adapter", tmp_path / "base")
        load_adapter_checkpoint(tmp_path / "adapter", Adapters(tmp_path / "base"))
        load_adapter_checkpoint(tmp_path / "adapter", Adapters(tmp_path / "base", merged=True))
    assert _deprecations(record) == []


def test_the_suites_guard_names_a_deprecated_call_from_our_code_not_a_tests():
    """A real transformers deprecation (``past_key_values=``) called from a file under gnq_core is
    reported with that file and line; the same call from a test file is not."""
    import own_warnings

    model = tiny_gpt2().eval()
    source = "model(input_ids=torch.tensor([[3, 4]]), past_key_values=None, use_cache=True)\n"
    for folder, ours in (("gnq_core", True), ("tests", False)):
        where = ROOT / folder / "probe_call.py"
        own_warnings.take()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            exec(compile(source, str(where), "exec"), {"model": model, "torch": torch})  # noqa: S102
        seen = own_warnings.take()
        if ours:
            assert seen and "gnq_core/probe_call.py:1" in seen[0] and "past_key_values" in seen[0]
        else:
            assert seen == []
