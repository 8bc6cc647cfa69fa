"""Family matrix: every LM family of the installed transformers, built tiny, on every path.

Each family of the causal, masked and sequence-to-sequence auto mappings is built from its config
(tests/families.py: one or two layers, width 32, vocabulary 64, float64, the config's dropout and
``use_cache``), called the way users call it (``model(input_ids=..., attention_mask=...)``, train
mode), audited on one batch unfused, fused and with the post-hoc ``auditor.backward``, and
compared with explicit per-example gradients of the same forward (the same dropout masks).  The
batch rotates over families (``families.condition``: right- or left-padded, B=3 T=5 or B=T=4), so
every condition is met by about a quarter of the families at the cost of one batch each.  Every
cell is exact, or a refusal listed with its reason in ``EXPECTED`` (the one place); a family a
new transformers release adds is in neither list and fails ``test_every_family_is_listed``.
The family table of docs/api.md is rendered from these lists (``python -m families`` from tests/, checked
by ``test_readme_table_is_current``).
"""

from __future__ import annotations

import pytest
import torch
from families import TABLE_END, TABLE_PAGE, TABLE_START, NotBuildable, build, check, families, render

# Exact on every path: kernel and GNQ within the bound derived from the problem (the Gram's length,
# the solve's conditioning, the model's own rounding measured on this machine:
# gnq_core.engine.math.tolerance), never below TOLERANCE's stated floor.
EXACT: dict[str, str] = {
    "afmoe": "causal", "albert": "masked", "apertus": "causal", "apertus1p5_text": "causal",
    "arcee": "causal", "aria_text": "causal", "axk1": "causal", "axk2": "causal", "bailing_hybrid": "causal",
    "bart": "seq2seq", "beam": "causal", "bert": "masked", "bert-generation": "causal", "big_bird": "masked",
    "bigbird_pegasus": "seq2seq", "biogpt": "causal", "bitnet": "causal", "blenderbot": "seq2seq",
    "blenderbot-small": "seq2seq", "camembert": "masked", "codegen": "causal", "cohere": "causal",
    "cohere2": "causal", "cohere2_moe": "causal", "convbert": "masked", "cpmant": "causal", "ctrl": "causal",
    "cwm": "causal", "data2vec-text": "masked", "deberta": "masked", "deberta-v2": "masked",
    "deepseek_v2": "causal", "deepseek_v3": "causal", "deepseek_v4": "causal", "diffllama": "causal",
    "distilbert": "masked", "doge": "causal", "dory": "causal", "electra": "masked", "ernie": "masked",
    "ernie4_5": "causal", "ernie4_5_moe": "causal", "esm": "masked", "eurobert": "masked", "exaone": "causal",
    "exaone4": "causal", "exaone_moe": "causal", "falcon": "causal", "falcon_h1": "causal",
    "falcon_mamba": "causal", "flex_olmo": "causal", "flint": "causal", "fnet": "masked", "funnel": "masked",
    "gemma": "causal", "gemma3_text": "causal", "gemma4_unified_text": "causal", "glm": "causal",
    "glm4": "causal", "glm4_moe": "causal", "glm4_moe_lite": "causal", "gpt-sw3": "causal", "gpt2": "causal",
    "gpt_bigcode": "causal", "gpt_neo": "causal", "gpt_neox": "causal", "gpt_neox_japanese": "causal",
    "gpt_oss": "causal", "gptj": "causal", "granite": "causal", "granite_swa": "causal",
    "granitemoe": "causal", "granitemoeshared": "causal", "gte": "masked", "helium": "causal",
    "hrm_text": "causal", "hunyuan_v1_dense": "causal", "hunyuan_v1_moe": "causal", "hy_v3": "causal",
    "hyperclovax": "causal", "ibert": "masked", "inkling2_loop_text": "causal", "inkling_text": "causal",
    "internlm3": "causal", "iquestcoder": "causal", "jais2": "causal", "jamba": "causal", "jetmoe": "causal",
    "jina_embeddings_v3": "masked", "kimi_linear": "causal", "kolibri1": "causal", "laguna": "causal",
    "lara_mini": "causal", "layoutlm": "masked", "lfm2": "causal", "lfm3": "causal", "llama": "causal",
    "llama4_text": "causal", "longformer": "masked", "longt5": "seq2seq", "m2m_100": "seq2seq",
    "mamba": "causal", "mamba2": "causal", "marian": "seq2seq", "mbart": "seq2seq", "megatron-bert": "masked",
    "mellum": "causal", "mimo_v2_flash": "causal", "minicpm3": "causal", "minimax": "causal",
    "minimax_m2": "causal", "minimax_m3_vl_text": "causal", "ministral": "causal", "ministral3": "causal",
    "mistral": "causal", "mixtral": "causal", "mobilebert": "masked", "modernbert": "masked",
    "modernbert-decoder": "causal", "moshi": "causal", "mpnet": "masked", "mpt": "causal", "mt5": "seq2seq",
    "mvp": "seq2seq", "nanochat": "causal", "nemotron": "causal", "nemotron_h": "causal", "neomme": "masked",
    "nllb-moe": "seq2seq", "nomic_bert": "masked", "nystromformer": "masked", "olmo": "causal",
    "olmo2": "causal", "olmo3": "causal", "olmo_hybrid": "causal", "olmoe": "causal", "openai-gpt": "causal",
    "opt": "causal", "pegasus": "seq2seq", "pegasus_x": "seq2seq", "persimmon": "causal", "phi": "causal",
    "phi3": "causal", "phimoe": "causal", "plbart": "seq2seq", "prophetnet": "seq2seq", "qwen2": "causal",
    "qwen2_moe": "causal", "qwen3": "causal", "qwen3_5_moe_text": "causal", "qwen3_5_text": "causal",
    "qwen3_moe": "causal", "qwen3_next": "causal", "qwen4_exp_text": "causal", "rembert": "masked",
    "roberta": "masked", "roberta-prelayernorm": "masked", "roformer": "masked", "rwkv": "causal",
    "sarvam_mla": "causal", "sarvam_moe": "causal", "seamless_m4t": "seq2seq", "seamless_m4t_v2": "seq2seq",
    "seed_oss": "causal", "smollm3": "causal", "solar_open": "causal", "squeezebert": "masked",
    "stablelm": "causal", "starcoder2": "causal", "switch_transformers": "seq2seq", "t5": "seq2seq",
    "tapas": "masked", "trocr": "causal", "ultrabert": "masked", "umt5": "seq2seq", "whisper": "causal",
    "xglm": "causal", "xlm-roberta": "masked", "xlm-roberta-xl": "masked", "xlstm": "causal",
    "yoso": "masked", "youtu": "causal",
}

# Families whose own forward computes in float32 inside a float64 model: the replayed kernels
# agree with the reference to that precision (a stated floor under the derived bound).
TOLERANCE: dict[str, tuple[float, str]] = {
    "deepseek_v4": (1e-6, "norms, rotary embeddings and attention scores computed in float32"),
}

# Exact under the family's batch (families.condition), not under every one.
NOTES: dict[str, str] = {
    "longformer": "checked at B=T=4; refused (its per-example replay of padded attention windows gives "
                  "non-finite gradients) when the sequence is not a multiple of its attention window",
}

_NOT_TINY = "unbuildable", "sizes beyond the common width names (vision/audio towers, fixed widths)"
_CONFIG = "unbuildable", "its config needs fields beyond the common width names to build tiny"
_FLOAT32 = "unbuildable", "mixes float32 and float64 internally: no float64 reference"

# The one place: every family that is not exact on every path, and why.
#   ("refused", why): every path raises a typed error in one line naming the family and module;
#   ("unbuildable", why): not built tiny from its config alone, so not checked.
EXPECTED: dict[str, tuple[str, str]] = {
    "led": ("refused", "UnsupportedModuleError: the encoder's per-example replay of its padded attention "
                       "windows gives non-finite gradients"),
    **dict.fromkeys(["bloom", "gemma2", "granitemoe_swa", "vaultgemma"], (
        "refused", "GNQNumericalError: on a left-padded batch its own loss is NaN (a pad query that "
                   "attends to nothing); exact right-padded")),
    "recurrent_gemma": ("refused", "UnsupportedModuleError: the RG-LRU keeps its recurrent state between "
                                   "calls, so a per-example replay is not the batch's computation"),
    **dict.fromkeys(["inkling2_text", "mra", "xlnet"], _FLOAT32),
    "xmod": ("unbuildable", "needs a default language set before its forward runs"),
    "gemma3n": ("unbuildable", "needs the timm library (vision tower)"),
    **dict.fromkeys([
    "git", "audioflamingo3", "blt", "deepseek_v32", "dots3_note", "emu3", "encoder-decoder", "flaubert",
    "fsmt", "fuyu", "gemma3", "gemma4", "gemma4_text", "gemma4_unified", "glm_moe_dsa", "glmasr",
    "got_ocr2", "granite_speech", "granite_speech_plus", "hy_v4", "llama4", "longcat_flash", "luke",
    "mllama", "modernvbert", "moss_transcribe_diarize", "musicflamingo", "nemo_speechlm", "omniasr",
    "perceiver",
    "phi4_multimodal", "qwen2_audio", "qwen3_5", "qwen3_5_moe", "qwen3_asr", "roc_bert", "t5gemma",
    "t5gemma2", "ultravbert", "vibevoice_asr", "voxtral", "voxtral_realtime", "xlm",
    ], _NOT_TINY),
    **dict.fromkeys([
        "bamba", "cohere_compass_text", "dbrx", "dots1", "dots3_note_text", "esmc", "gemma3n_text",
        "gemma4_assistant", "gemma4_unified_assistant", "granitemoehybrid", "lfm2_moe", "musicgen",
        "musicgen_melody", "qwen4_exp", "reformer", "zamba", "zamba2", "zaya",
    ], _CONFIG),
}

# Families whose three audited passes take seconds each on CPU (chunked linear-attention and
# state-space reference kernels): checked in the slow set.
SLOW = {"kimi_linear", "qwen3_5_moe_text", "nemotron_h", "qwen4_exp_text", "qwen3_next", "qwen3_5_text",
        "afmoe"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: OpenMP threads on shared cores only wait for each other (10x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_every_family_is_listed():
    """A family transformers adds (or drops) must be looked at and listed here."""
    assert not set(EXACT) & set(EXPECTED)
    found = families()
    assert set(found) - set(EXACT) - set(EXPECTED) == set(), "new families: run them and list them"
    assert set(EXACT) | set(EXPECTED) == set(found), "families gone from transformers: drop them"
    assert {f: found[f] for f in EXACT} == EXACT


def _check(family: str) -> None:
    task = families()[family]
    kind, why = EXPECTED.get(family, ("exact", ""))
    floor = TOLERANCE.get(family, (0.0, ""))[0]
    try:
        model = build(family, task)
        cells = check(model, family, task, floor=floor)
    except NotBuildable as exc:
        assert kind == "unbuildable", f"{family} no longer builds tiny ({exc}); expected {kind}"
        return
    assert kind != "unbuildable", f"{family} now builds tiny: check it and move it out of EXPECTED"
    for cell in cells:
        if kind == "refused":
            assert cell.refusal is not None, f"{family} {cell.path}: expected a refusal ({why}), got exact"
            assert cell.refusal.startswith(why.split(":")[0] + ":"), cell.refusal
            # the auditor's own refusals name the family; a NaN is the model's own loss
            assert family in cell.refusal or why.startswith("GNQNumericalError"), cell.refusal
            assert "\n" not in cell.refusal
        else:
            assert cell.refusal is None, f"{family} {cell.path} refused: {cell.refusal}"
            assert cell.exact, f"{family} {cell.path}: {cell.detail}"


@pytest.mark.parametrize("family", sorted(set(families()) - SLOW))
def test_family(family):
    _check(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SLOW))
def test_slow_family(family):
    _check(family)


def test_family_table_is_current():
    text = TABLE_PAGE.read_text(encoding="utf-8")
    section = text[text.index(TABLE_START) + len(TABLE_START):text.index(TABLE_END)]
    expected = render(EXACT, EXPECTED, TOLERANCE, NOTES).strip()
    assert section.strip() == expected, "docs/api.md's family table is stale: cd tests && python -m families"
