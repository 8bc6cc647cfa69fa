"""Every language-model family of the installed transformers, built tiny from its config.

`families()` lists the model types of the causal, masked and sequence-to-sequence LM auto
mappings; `build(family)` makes a seeded float64 model with tiny widths (one layer, two where a
family needs them, width 32, vocabulary 64, the config's own dropout and `use_cache`) or raises
`NotBuildable` saying why; `check(family, path)` audits one batch on every path, called the way
users call a model (`model(input_ids=..., attention_mask=...)`, `use_cache` at its default,
train mode with the config's dropout), and compares with explicit per-example gradients taken
from the same forward (the same dropout masks).  Each family gets one of `CONDITIONS` by a
deterministic rotation on its name: right- or left-padded, B=3 T=5 or B=T=4.
Used by tests/engine/test_family_matrix.py and by `python -m tests.families` (writes the family table of
docs/api.md).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)

from gnq_core.engine.math.reference import loo_gnq, per_example_gradients
from gnq_core.engine.math.tolerance import exactness, kernel_noise, rounding_sensitivity

VOCAB, WIDTH, B, T = 64, 32, 3, 5
PATHS = ("unfused", "fused", "posthoc")

# Config fields set wherever a family's config has them (names differ between families).
_TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    **dict.fromkeys(["hidden_size", "n_embd", "d_model", "dim", "embed_dim", "n_embed",
                     "embedding_size", "word_embed_proj_dim", "d_embed"], WIDTH),
    **dict.fromkeys(["num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
                     "decoder_layers", "num_decoder_layers"], 1),
    **dict.fromkeys(["num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_heads"], 2),
    **dict.fromkeys(["num_key_value_heads", "multi_query_group_num", "num_kv_heads"], 1),
    **dict.fromkeys(["intermediate_size", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "d_ff", "ffn_hidden_size", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "expert_intermediate_size",
                     "dense_intermediate_size", "d_inner"], 32),
    **dict.fromkeys(["head_dim", "d_kv", "kv_channels", "attention_head_size"], 16),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                     "seq_length"], 64),
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k"], 2),
    **dict.fromkeys(["mamba_chunk_size", "chunk_size", "ssm_chunk_size"], 8),
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0,
}
# Config keyword arguments every family accepts: mixture-of-experts layers as plain per-expert
# loops (the grouped-matmul kernels take no float64).
_ALWAYS: dict[str, Any] = {"experts_implementation": "eager"}


# Families whose tiny config needs more than the common names (routing groups, rotary widths...).
_FAMILY: dict[str, dict[str, Any]] = {
    **dict.fromkeys(["deepseek_v2", "deepseek_v3", "axk1", "axk2", "glm4_moe_lite", "minicpm3", "youtu"],
                    {"n_group": 1, "topk_group": 1, "num_key_value_heads": 2}),
    "codegen": {"rotary_dim": 4, "n_head": 4},
    "gptj": {"rotary_dim": 8},
    "ernie4_5_moe": {"moe_k": 2},
    **dict.fromkeys(["longformer", "led"], {"attention_window": 4}),
    "diffllama": {"num_key_value_heads": 2},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "num_layers": 2},
    **dict.fromkeys(["rwkv", "olmo_hybrid"], {"num_hidden_layers": 2}),
    "mamba2": {"head_dim": 16, "n_groups": 1, "num_heads": 4},
    # hybrids: one attention layer besides the recurrent one (with the default cache, a model of
    # recurrent layers alone fails in its own forward: "get_seq_length can only be called on
    # Attention layers")
    "jamba": {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 1},
    "bailing_hybrid": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                       "num_key_value_heads": 2,
                       "layer_group_size": 2},
    "lfm3": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
    "recurrent_gemma": {"num_hidden_layers": 2, "block_types": ["recurrent", "attention"]},
    **dict.fromkeys(["qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"],
                    {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}),
    "qwen4_exp_text": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "indexed_attention"],
                       "indexer_budget": 4, "indexer_compress_ratio": 2, "indexer_n_heads": 2,
                       "indexer_kv_heads": 1, "indexer_head_dim": 16},
    "kimi_linear": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                    "mlp_layer_types": ["dense", "dense"], "num_key_value_heads": 2},
    # its own forward fails with its default cache at any tiny width ("matC_old has wrong shape")
    "xlstm": {"use_cache": False},
    # transformers 5.24: a looped middle block between input and output layers (its defaults are 8
    # layers each side), a hybrid with one full-attention layer, multi-head latent attention
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1, "n_recurrent_layers": 1},
    "lara_mini": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                  "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                  "linear_num_value_heads": 2},
    "sarvam_mla": {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 8,
                   "num_key_value_heads": 2},
    "inkling2_loop_text": {"num_hidden_layers": 3, "unpadded_vocab_size": VOCAB, "swa_num_attention_heads": 2,
                           "swa_num_key_value_heads": 1, "swa_head_dim": 16, "d_rel": 4, "loop_gate_rank": 4,
                           "loop_layer_index_start": 1, "loop_layer_index_end": 2, "loop_num_passes": 2,
                           "n_layers_per_attn_res_block": 1},
}


class NotBuildable(Exception):
    """The family cannot be built tiny from its config alone (vision towers, audio, ...)."""


def families() -> dict[str, str]:
    """{model_type: task} for every LM family the installed transformers registers."""
    out = {}
    for task, names in (("seq2seq", MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
                        ("masked", MODEL_FOR_MASKED_LM_MAPPING_NAMES),
                        ("causal", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)):
        for family in names:
            out.setdefault(family, task)
    return dict(sorted(out.items()))


def _overrides(config_class: type) -> dict[str, Any]:
    names = set(inspect.signature(config_class.__init__).parameters)
    return {k: v for k, v in _TINY.items() if k in names}


def build(family: str, task: str) -> torch.nn.Module:
    config_class = CONFIG_MAPPING[family]
    try:
        config = config_class(**{**_overrides(config_class), **_FAMILY.get(family, {})}, **_ALWAYS)
    except Exception as exc:  # noqa: BLE001  (any config error: the family needs more than widths)
        raise NotBuildable(f"config: {type(exc).__name__}: {exc}") from exc
    auto = {"causal": AutoModelForCausalLM, "masked": AutoModelForMaskedLM,
            "seq2seq": AutoModelForSeq2SeqLM}[task]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            with torch.device("meta"):  # count first: a default-sized tower would not fit
                size = sum(p.numel() for p in auto.from_config(config).parameters())
            if size > 3_000_000:
                raise NotBuildable(f"not tiny ({size:,} parameters): sizes beyond the common width names")
            torch.manual_seed(0)
            model = auto.from_config(config, dtype=torch.float64)
    except NotBuildable:
        raise
    except Exception as exc:  # noqa: BLE001
        raise NotBuildable(f"model: {type(exc).__name__}: {exc}") from exc
    return model.eval()


@dataclass(frozen=True)
class Condition:
    """How one family's batch is called: padding side, batch size, sequence length, mode."""

    padding: str  # "right" or "left": example 1 has two pad tokens on that side
    B: int
    T: int
    train: bool = True  # train mode with the config's dropout

    def __str__(self) -> str:
        return f"{'train' if self.train else 'eval'}, {self.padding}-padded, B={self.B} T={self.T}"


CONDITIONS = (Condition("right", B, T), Condition("left", B, T), Condition("right", 4, 4),
              Condition("left", 4, 4))


def condition(family: str) -> Condition:
    """The family's condition: a rotation by a hash of its name (stable as families come and go)."""
    return CONDITIONS[zlib.crc32(family.encode()) % len(CONDITIONS)]


def batch(task: str, seed: int = 0, cond: Condition = CONDITIONS[0]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (cond.B, cond.T), generator=gen)
    mask = torch.ones(cond.B, cond.T, dtype=torch.long)
    if cond.padding == "right":
        mask[1, -2:] = 0
    else:
        mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)  # the pad token, as a tokenizer writes it
    out = {"input_ids": ids, "attention_mask": mask}
    if task == "seq2seq":
        out["decoder_input_ids"] = torch.randint(3, VOCAB, (cond.B, cond.T - 1), generator=gen)
    return out


def losses(model: torch.nn.Module, task: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """ℓ_j: mean token NLL of example j (next token for causal, the token itself otherwise)."""
    out = model(**inputs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    if task == "causal":
        targets = inputs["input_ids"][:, 1:].masked_fill(inputs["attention_mask"][:, 1:] == 0, -100)
        logits = logits[:, :-1]
    elif task == "masked":
        targets = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    else:
        targets = inputs["decoder_input_ids"].roll(-1, 1)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                          ignore_index=-100, reduction="none").view(targets.shape)
    return nll.sum(1) / (targets != -100).sum(1).clamp(min=1)


@dataclass
class Cell:
    family: str
    path: str
    exact: bool  # within the derived bound (gnq_core.engine.math.tolerance)
    error: float | None = None  # largest relative error (kernel or GNQ) against the reference
    refusal: str | None = None  # "ExceptionType: message" when the auditor refused
    detail: str = ""  # the errors and their bounds


def check(model: torch.nn.Module, family: str, task: str, lam: float = 1e-2,
          cond: Condition | None = None, seed: int = 0, floor: float = 0.0) -> list[Cell]:
    """One batch on every path against explicit per-example gradients (float64) from the same
    forward: the reference and every audited forward start from one random-number seed, so they
    draw the same dropout masks.  Exact means within the bound derived from the problem
    (gnq_core.engine.math.tolerance: the Gram's length P, the solve's conditioning and, when that a
    priori bound is exceeded, the model's own rounding measured by ``reference_noise``);
    ``floor``: a stated lower bound (a family that computes in float32 on purpose)."""
    cond = condition(family) if cond is None else cond
    inputs = batch(task, seed, cond)
    model.train(cond.train)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with torch.no_grad():  # a first call may change the model (BigBird: block-sparse to full
            model(**{k: v[:1] for k, v in inputs.items()})  # attention for short inputs)
        transformers.set_seed(seed)  # torch, numpy and random (BigBird draws from numpy)
        G = per_example_gradients(losses(model, task, inputs), params)
    except Exception as exc:  # noqa: BLE001  (the model itself does not run tiny in float64)
        raise NotBuildable(f"float64 forward: {type(exc).__name__}: {exc}".split("\n")[0]) from exc
    K_ref, gnq_ref = G @ G.T, loo_gnq(G, lam)
    measured: list[float] = []

    def noise() -> float:  # measured once, only where a path exceeds the a priori bound
        if not measured:
            measured.append(reference_noise(model, task, inputs, params, seed))
        return measured[0]

    return [_one_path(model, family, task, inputs, path, lam, K_ref, gnq_ref, seed, noise, floor)
            for path in PATHS]


def reference_noise(model: torch.nn.Module, task: str, inputs: dict[str, torch.Tensor],
                    params: list[torch.Tensor], seed: int = 0) -> float:
    """The model's own rounding, as this machine does it (gnq_core.engine.math.tolerance): the larger
    of how far two honest references differ (per-example gradients from the batch's forward and
    from each example's own forward, eval mode: no dropout to tell them apart) and how far the
    reference moves when the parameters are perturbed at their rounding (the model's mode, the
    same dropout masks)."""
    def reference() -> torch.Tensor:
        transformers.set_seed(seed)
        return per_example_gradients(losses(model, task, inputs), params)

    sensitivity = rounding_sensitivity(reference, params, seed)
    training = model.training
    model.eval()
    try:
        together = reference()
        rows = [{k: v[j:j + 1] for k, v in inputs.items()} for j in range(together.shape[0])]
        alone = torch.cat([per_example_gradients(losses(model, task, row), params) for row in rows])
    finally:
        model.train(training)
    return max(sensitivity, kernel_noise(together, alone))


def _one_path(model, family, task, inputs, path, lam, K_ref, gnq_ref, seed=0, noise=None, floor=0.0) -> Cell:
    from gnq_core import GNQAuditor

    model.zero_grad(set_to_none=True)
    try:
        with GNQAuditor(model, lam=lam, fused=path == "fused") as auditor:
            transformers.set_seed(seed)
            objective = losses(model, task, inputs).sum()
            if path == "posthoc":
                auditor.backward(objective)
            else:
                objective.backward()
            res = auditor.compute()
    except Exception as exc:  # noqa: BLE001  (a refusal is any exception; the test checks its type)
        return Cell(family, path, False, refusal=f"{type(exc).__name__}: {exc}".split("\n")[0])
    finally:
        model.zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = exactness(res.kernel, res.gnq, K_ref, gnq_ref, lam, n_params, floor=floor)
    if not result.ok and noise is not None:
        result = exactness(res.kernel, res.gnq, K_ref, gnq_ref, lam, n_params, noise=noise(), floor=floor)
    return Cell(family, path, result.ok, error=result.error, detail=result.describe())


def render(exact: dict[str, str], expected: dict[str, tuple[str, str]],
           tolerance: dict[str, tuple[float, str]], notes: dict[str, str] | None = None) -> str:
    """The family table of docs/api.md, from the matrix test's own lists
    (tests/engine/test_family_matrix.py)."""
    notes = notes or {}
    tasks = {"causal": "causal LM", "masked": "masked LM", "seq2seq": "sequence-to-sequence LM"}
    checked = [f for f, _ in exact.items()] + [f for f, (kind, _) in expected.items() if kind == "refused"]
    lines = [f"{len(exact)} of the {len(checked)} LM families that transformers "
             f"{transformers.__version__} can build tiny are exact on every path (unfused, fused, post-hoc) "
             "against explicit per-example gradients in float64, called the way users call a model: "
             "`use_cache` at its default, train mode with the config's dropout (the reference is "
             "differentiated per example through the same forward, so with the same masks), one batch "
             "per family rotating over right- and left-padded, B=3 T=5 and B=T=4 "
             f"(tests/engine/test_family_matrix.py; {len(expected) - (len(checked) - len(exact))} more "
             "cannot be built tiny from their config alone or do not run in float64, and are not "
             "checked).", ""]
    for task, title in tasks.items():
        names = sorted(f for f, t in exact.items() if t == task)
        lines += [f"**Exact, {title} ({len(names)}):** " + ", ".join(
            n + ("†" if n in tolerance else "") + ("‡" if n in notes else "") for n in names), ""]
    if tolerance:
        items = [f"{n}: {why} (agreement {tol:g})" for n, (tol, why) in sorted(tolerance.items())]
        lines += ["† " + "; ".join(items), ""]
    if notes:
        lines += ["‡ " + "; ".join(f"{n}: {why}" for n, why in sorted(notes.items())), ""]
    refused = {f: why for f, (kind, why) in expected.items() if kind == "refused"}
    lines += ["| refused (one line, exit code 1) | batch | why |", "|---|---|---|"]
    lines += [f"| {f} | {condition(f)} | {why} |" for f, why in sorted(refused.items())]
    return "\n".join(lines) + "\n"


def write_table() -> None:
    """Replace the family section of docs/api.md (between its markers) with ``render``'s table."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "engine"))  # run as `python -m tests.families`
    from test_family_matrix import EXACT, EXPECTED, NOTES, TOLERANCE

    path = TABLE_PAGE
    text = path.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    path.write_text(text[:start] + "\n" + render(EXACT, EXPECTED, TOLERANCE, NOTES) + text[end:],
                    encoding="utf-8")


# The Python API page of the docs site holds the table (README is kept short).
TABLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
TABLE_START, TABLE_END = "<!-- families:start -->", "<!-- families:end -->"

if __name__ == "__main__":
    write_table()
