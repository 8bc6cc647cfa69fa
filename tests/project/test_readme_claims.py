"""The evidence page (docs/evidence.md, "What GNQ tells you"): every number it cites is read here from
a committed report's JSON, formatted as the page writes it, and must appear on that page, so a claim
is never stated without the report behind it.  A report rerun with other numbers, or an edit of the
page that drifts from the reports, fails this test."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence.md"


@cache
def section() -> str:
    text = EVIDENCE.read_text(encoding="utf-8")
    return " ".join(text.replace("−", "-").split())  # the page's minus sign; one line


@cache
def report(path: str) -> dict:
    return json.loads((ROOT / "reports" / path).read_text(encoding="utf-8"))


def one(rows: list[dict], **match) -> dict:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, len(found))
    return found[0]


def ci(value: float, lo: float, hi: float, fmt: str = ".2f") -> str:
    return f"{value:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def row_ci(r: dict, key: str = "auc", fmt: str = ".2f") -> str:
    """A flat row ("auc", "auc lo", "auc hi"), or a gnq-report row ({value, lo, hi})."""
    v = r[key]
    if isinstance(v, dict):
        return ci(v["value"], v["lo"], v["hi"], fmt)
    return ci(v, r[f"{key} lo"], r[f"{key} hi"], fmt)


# ---------------------------------------------------------------------------------------- reports
def real_model(signal: str) -> str:
    r = one(report("real-model/results.json")["membership"], signal=signal)
    return r["AUC [95% CI]"]


def real_model_extraction(signal: str) -> str:
    r = one(report("real-model/results.json")["extraction"], scope="all texts", signal=signal)
    return f"{r['auc']:.2f}"


def ck_real(outcome: str, signal: str, scope: str, key: str = "auc") -> str:
    """Per text (copies resampled together), the unit the evidence page cites."""
    r = one(report("common-knowledge-real/results.json")["evidence"], outcome=outcome, signal=signal,
            scope=scope, unit="texts")
    return row_ci(r, key, "+.3f" if key == "gain" else ".2f")


def ck_real_excess_kept(outcome: str, signal: str) -> str:
    """How much of a signal's AUC excess over chance survives holding token length exactly fixed."""
    rows = report("common-knowledge-real/results.json")["evidence"]
    auc = {scope: one(rows, outcome=outcome, signal=signal, scope=scope, unit="texts")["auc"]
           for scope in ("all", "exact length")}
    return f"keeps {100 * (auc['exact length'] - 0.5) / (auc['all'] - 0.5):.0f}% of its excess over chance"


def counterfactual(run: str, column: str, key: str = "partial") -> str:
    """A signal's partial ρ or CV gain against counterfactual memorisation (``python -m research
    study counterfactual``)."""
    return row_ci(one(report(f"{run}/results.json")["signals"], column=column), key,
                  "+.3f" if key == "gain" else ".3f")


def counterfactual_verdict(run: str) -> str:
    """The rule's verdict as the report's first line puts it in bold."""
    return report(f"{run}/results.json")["verdict"].split("**")[1]


def counterfactual_scale(run: str) -> tuple[str, str]:
    """("N seeds", "P independent positive records") as the evidence page counts them."""
    d = report(f"{run}/results.json")
    positives = one(d["signals"], column="gnq")["positive records"]
    seeds = len(d["seeds"])
    return f"{seeds} seed{'s' if seeds > 1 else ''}", f"{positives} independent positive records"


def counterfactual_cost(run: str) -> str:
    """The measured wall time per half-trained model and the full specification's estimate."""
    c = report(f"{run}/results.json")["cost"]
    k8, k16 = c["estimated_hours_k8"], c["estimated_hours_k16"]
    cpu8, cpu16 = c["estimated_cpu_hours_k8"], c["estimated_cpu_hours_k16"]
    return (f"{c['per_model_seconds']:.0f} s of wall time per half-trained model; the full specification "
            f"would take about {k8:.0f} hours at K = 8 and {k16:.0f} at K = 16 ({cpu8:.0f} and {cpu16:.0f} "
            "CPU hours")


def spearman(path: str, column: str) -> str:
    r = one(report(path)["spearman"], column=column)
    return row_ci(r, "rho")


def demo(run: str, positive: str, signal: str, scope: str, unit: str, key: str = "auc") -> str:
    r = one(report(f"demo/{run}.json")["tables"], positive=positive, signal=signal, scope=scope, unit=unit)
    assert not r["too_few"], r.get("note")
    return row_ci(r, key, "+.3f" if key == "cv_auc_gain" else ".2f")


def demo_record_gain(positive: str, signal: str) -> str:
    """A signal's post-hoc CV gain per record (copies collapsed) on the demo's audit run."""
    return demo("demo-audit", positive, signal, "over length + loss", "records", "cv_auc_gain")


def demo_records(run: str, positive: str) -> str:
    """"N of M texts ... K independent records": the counts the evidence page cites for an outcome."""
    r = one(report(f"demo/{run}.json")["tables"], positive=positive, signal="gnq_total", scope="all",
            unit="texts")
    return f"{r['positives']} of {r['n']} texts, {r['independent_positives']} records"


def demo_count(run: str, positive: str) -> int:
    return one(report(f"demo/{run}.json")["tables"], positive=positive, signal="gnq_total", scope="all",
               unit="texts")["independent_positives"]


def demo_too_few(run: str, positive: str) -> str:
    rows = [r for r in report(f"demo/{run}.json")["tables"] if r["positive"] == positive]
    assert rows and all(r["too_few"] for r in rows)
    return "too few"


def demo_nature(run: str) -> str:
    n = report(f"demo/{run}.json")["gnq_on_this_run"]
    return f"share explained {100 * n['explained_median']:.1f}%"


def companions_share(c: str, texts: str = "members: corpus texts", key: str = "share median") -> str:
    """The companions study's mean over seeds of a share row (``reports/companions/``)."""
    rows = [r for r in report("companions/results.json")["shares"] if r["c"] == c and r["texts"] == texts]
    assert rows
    return f"{sum(r[key] for r in rows) / len(rows):.3f}"


def companions_auc(outcome: str, signal: str, seed: str, key: str = "auc") -> str:
    r = one(report("companions/results.json")["outcomes"], outcome=outcome, signal=signal, seed=seed)
    if key == "gain":
        return ci(r["gain"], r["gain_lo"], r["gain_hi"], "+.3f")
    return ci(r["auc_within_length"], r["auc_lo"], r["auc_hi"])


def companions_error(k: int) -> str:
    rows = [r for r in report("companions/results.json")["sketch_error"]["rows"] if r["k"] == k]
    rows.sort(key=lambda r: r["median_rel_error"])
    median = rows[(len(rows) - 1) // 2]["median_rel_error"] if len(rows) % 2 else \
        (rows[len(rows) // 2 - 1]["median_rel_error"] + rows[len(rows) // 2]["median_rel_error"]) / 2
    return f"{100 * median:.1f}%"


@cache
def benchmark(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text(encoding="utf-8"))


def sketch_at_scale(variant: str, c: int | str, key: str | None = None,
                    result: str = "sketch_error-companions-cpu.json") -> str:
    """The companions sketch error against exact GNQ at c = 256 and all
    (``benchmarks/sketch_error_companions.py``): "median% (p95%, Spearman)", or one number
    (``key``; ``gnq_rel_median``: as a percentage)."""
    r = one(benchmark(result)["summary"], variant=variant, c=c)
    assert r["gnq_signed_rel_median"] < 0, "the page says sketched GNQ runs low (the share high)"
    if key == "gnq_rel_median":
        return f"{100 * r[key]:.1f}%"
    if key is not None:
        return f"{r[key]:.3f}"
    return f"{100 * r['gnq_rel_median']:.1f}% ({100 * r['gnq_rel_p95']:.1f}%, {r['spearman']:.3f})"


CLAIMS: dict[str, Callable[[], str]] = {
    "real-model λ·GNQ/K_jj median":
        lambda: f"{report('real-model/results.json')['gnq_lambda_over_kjj_median']:.2f}",
    "common-knowledge Spearman(GNQ, K_jj)":
        lambda: f"{report('common-knowledge/results.json')['gnq_vs_self_influence']['spearman']:.3f}",
    "common-knowledge-real λ·GNQ/K_jj median":
        lambda: f"{report('common-knowledge-real/results.json')['gnq_lambda_over_kjj_median']:.2f}",
    "demo share explained": lambda: demo_nature("demo-audit"),
    "real-model membership loss": lambda: real_model("loss"),
    "real-model membership Min-K%++": lambda: real_model("Min-K%++"),
    "real-model membership loss ratio": lambda: real_model("loss ratio to the base model"),
    "real-model membership GNQ": lambda: real_model("GNQ (post hoc, last checkpoint)"),
    "real-model membership K_jj": lambda: real_model("gradient norm² ‖g‖² (K_jj)"),
    "membership ρ GNQ_total": lambda: spearman("membership/results.json", "gnq_total"),
    "membership ρ K_jj": lambda: spearman("membership/results.json", "self_influence"),
    "membership-canaries ρ GNQ_total": lambda: spearman("membership-canaries/results.json", "gnq_total"),
    "membership-canaries ρ Min-K%": lambda: spearman("membership-canaries/results.json", "min_k"),
    "real-model extraction loss (point)": lambda: real_model_extraction("loss_last"),
    "real-model extraction GNQ_total (point)": lambda: real_model_extraction("gnq_total"),
    "demo extraction counts": lambda: demo_records("demo-audit", "extracted"),
    "demo extraction too few": lambda: demo_too_few("demo-audit", "extracted"),
    "demo secret-like counts": lambda: demo_records("demo-training", "group = secret"),
    "demo secret-like gain per text": lambda: demo("demo-training", "group = secret", "gnq_total",
                                                   "over length + loss", "texts", "cv_auc_gain"),
    "demo secret-like gain per record": lambda: demo("demo-training", "group = secret", "gnq_total",
                                                     "over length + loss", "records", "cv_auc_gain"),
    "demo canary records": lambda: f"{demo_count('demo-training', 'group = canary')} canary records",
    "demo common GNQ_last gain per record": lambda: demo("demo-audit", "group = common", "gnq_last",
                                                         "over length + loss", "records", "cv_auc_gain"),
    "demo common K_jj gain per record": lambda: demo_record_gain("group = common", "self_influence_last"),
    "demo surprising K_jj gain per record":
        lambda: demo_record_gain("group = surprising", "self_influence_last"),
    "demo common records": lambda: f"{demo_count('demo-audit', 'group = common')} records",
    "demo surprising GNQ_last gain per record": lambda: demo("demo-audit", "group = surprising", "gnq_last",
                                                            "over length + loss", "records", "cv_auc_gain"),
    "demo surprising records": lambda: f"{demo_count('demo-audit', 'group = surprising')} records",
    "ck-real extraction GNQ_total": lambda: ck_real("extraction", "gnq_total", "all"),
    "ck-real extraction GNQ_total exact length": lambda: ck_real("extraction", "gnq_total", "exact length"),
    "ck-real extraction GNQ_total excess kept within length":
        lambda: ck_real_excess_kept("extraction", "gnq_total"),
    "ck-real extraction GNQ_total gain":
        lambda: ck_real("extraction", "gnq_total", "over length + loss", "gain"),
    "ck-real group GNQ_total": lambda: ck_real("group", "gnq_total", "all"),
    "ck-real group counterfactual": lambda: ck_real("group", "counterfactual_memorization", "all"),
    "ck-real group GNQ_total exact length": lambda: ck_real("group", "gnq_total", "exact length"),
    "ck-real group GNQ_last exact length": lambda: ck_real("group", "gnq_last", "exact length"),
    "ck-real group GNQ_total gain": lambda: ck_real("group", "gnq_total", "over length + loss", "gain"),
    "ck-real group GNQ_last gain": lambda: ck_real("group", "gnq_last", "over length + loss", "gain"),
    "ck-real group loss": lambda: ck_real("group", "loss_last", "all"),
}

def counterfactual_reliability(run: str, scope: str) -> str:
    """The outcome's split-half reliability (Spearman–Brown) over the seeds, lowest to highest."""
    rows = [r for r in report(f"{run}/results.json")["reliability"] if r["scope"] == scope]
    values = sorted(r["spearman_brown"] for r in rows)
    return f"{values[0]:.2f} to {values[-1]:.2f}"


def counterfactual_kept(run: str, scope: str) -> str:
    """The share of top records both halves reproduce, against the share unrelated halves would."""
    rows = [r for r in report(f"{run}/results.json")["positives"] if r["scope"] == scope]
    kept = sum(r["positives (reproduced)"] for r in rows) / sum(r["top records"] for r in rows)
    null = sum(r["share kept if the halves were unrelated"] for r in rows) / len(rows)
    return f"{kept:.0%} of the top records ({null:.0%} if the halves were unrelated)"


def counterfactual_variant(run: str, column: str) -> str:
    """A GNQ measure's partial ρ at the Bonferroni-corrected level of the report's first lines."""
    return row_ci(one(report(f"{run}/results.json")["gnq_variants"], column=column), "partial", ".3f")


CLAIMS["counterfactual cost"] = lambda: counterfactual_cost("counterfactual")
for _run in ("counterfactual-tiny", "counterfactual"):
    for _column in ("gnq", "k_jj", "gnq_in_run", "gnq_all", "risk_default"):
        CLAIMS[f"{_run} {_column} auc"] = lambda r=_run, c=_column: counterfactual(r, c, "auc")
    for _column in ("gnq", "gnq_in_run", "gnq_all"):
        CLAIMS[f"{_run} {_column} corrected partial"] = lambda r=_run, c=_column: counterfactual_variant(r, c)
    for _scope in ("all records", "base texts"):
        CLAIMS[f"{_run} reliability {_scope}"] = lambda r=_run, s=_scope: counterfactual_reliability(r, s)
    CLAIMS[f"{_run} positives kept"] = lambda r=_run: counterfactual_kept(r, "all records")
for _run, _partials, _gains in (("counterfactual-tiny", ("gnq", "k_jj", "log_copies"), ("gnq", "k_jj")),
                                ("counterfactual", ("gnq", "k_jj", "log_copies"), ("gnq",))):
    CLAIMS[f"{_run} verdict"] = lambda r=_run: f"**{counterfactual_verdict(r)}**"
    for _column in _partials:
        CLAIMS[f"{_run} {_column} partial"] = lambda r=_run, c=_column: counterfactual(r, c)
    for _column in _gains:
        CLAIMS[f"{_run} {_column} gain"] = lambda r=_run, c=_column: counterfactual(r, c, "gain")
    CLAIMS[f"{_run} seeds"] = lambda r=_run: counterfactual_scale(r)[0]
    CLAIMS[f"{_run} positives"] = lambda r=_run: counterfactual_scale(r)[1]

for _c in ("16", "64", "256", "all"):
    CLAIMS[f"companions share c = {_c}"] = lambda c=_c: companions_share(c)
    CLAIMS[f"companions Spearman c = {_c}"] = lambda c=_c: companions_share(c, key="spearman(GNQ, K_jj)")
CLAIMS["companions record copies share c = 256"] = lambda: companions_share("256", "members: record copies")
CLAIMS["companions sketch error k = 1024"] = lambda: f"a median {companions_error(1024)}"
CLAIMS["companions sketch error at scale, exact share"] = lambda: (
    f"an exact {sketch_at_scale('study', 256, 'share_explained_exact_median')} at c = 256 and "
    f"{sketch_at_scale('study', 'all', 'share_explained_exact_median')} against all")
CLAIMS["companions sketch error at scale, study's sketch"] = lambda: (
    f"GNQ low by a median {sketch_at_scale('study', 256)} at c = 256 and "
    f"{sketch_at_scale('study', 'all')} against all")
_SHARE_ERROR = "share_explained_abs_error_median"
CLAIMS["companions sketch error at scale, share"] = lambda: (
    f"the share explained high by a median {sketch_at_scale('study', 256, _SHARE_ERROR)} "
    f"and {sketch_at_scale('study', 'all', _SHARE_ERROR)}")
CLAIMS["companions sketch error at scale, 3 layers"] = lambda: "GNQ low by {} and {}, so".format(
    *(sketch_at_scale("study", c, "gnq_rel_median", "sketch_error-companions-layers3-cpu.json")
      for c in (256, "all")))
CLAIMS["companions sketch error at scale, audit's sketch"] = lambda: (
    f"the audit's default sketch by {sketch_at_scale('production', 256)} and "
    f"{sketch_at_scale('production', 'all')}")
CLAIMS["companions held-out records passing"] = lambda: "{} of {} held-out records".format(
    *report("companions/results.json")["held_out_records_passing_extraction"])
CLAIMS["companions extraction pooled"] = lambda: (
    f"GNQ against all members {companions_auc('extraction', 'GNQ (c = all)', 'pooled')} "
    "(extracted texts lower: "
    f"mostly record copies), K_jj {companions_auc('extraction', '‖g‖² (K_jj)', 'pooled')}, loss "
    f"{companions_auc('extraction', '−loss', 'pooled')}; CV gain of GNQ "
    f"{companions_auc('extraction', 'GNQ (c = all)', 'pooled', 'gain')}")
CLAIMS["companions extraction records"] = lambda: "{} extracted records over all".format(
    one(report("companions/results.json")["outcomes"], outcome="extraction", signal="−loss",
        seed="pooled")["positive_records"])
for _s in map(str, report("companions/results.json")["seeds"]):
    CLAIMS[f"companions membership GNQ seed {_s}"] = lambda s=_s: (
        f"seed {s}: GNQ {companions_auc('membership', 'GNQ (c = all)', s)}, "
        f"K_jj {companions_auc('membership', '‖g‖² (K_jj)', s)}")
    CLAIMS[f"companions membership GNQ gain seed {_s}"] = lambda s=_s: (
        f"seed {s} {companions_auc('membership', 'GNQ (c = all)', s, 'gain')}")
    CLAIMS[f"companions corpus membership seed {_s}"] = lambda s=_s: (
        f"seed {s}: GNQ {companions_auc('membership (corpus texts)', 'GNQ (c = all)', s)}, CV gain "
        f"{companions_auc('membership (corpus texts)', 'GNQ (c = all)', s, 'gain')}")
    CLAIMS[f"companions corpus loss seed {_s}"] = lambda s=_s: companions_auc(
        "membership (corpus texts)", "−loss", s)


@pytest.mark.parametrize("claim", list(CLAIMS))
def test_readme_cites_the_reports_number(claim):
    expected = CLAIMS[claim]().replace("−", "-")
    assert expected in section(), f"docs/evidence.md should cite {claim} as {expected!r}"


def test_every_interval_the_page_cites_is_read_from_a_report():
    """Each "value [lo, hi]" on the page is one some claim above computes from a report's JSON: a
    number typed in by hand, or left behind by a rerun, fails here."""
    cited = re.findall(r"[-+]?\d+\.\d+ \[[-+]?\d+\.\d+, [-+]?\d+\.\d+\]", section())
    made = " | ".join(claim().replace("−", "-") for claim in CLAIMS.values())
    assert len(cited) > 40, len(cited)  # the pattern still reads the page
    assert [c for c in cited if c not in made] == []


def test_every_cited_report_exists_and_every_claim_states_its_records_and_seeds():
    cited = set(re.findall(r"`reports/([\w-]+)/", section()))
    assert cited >= {"real-model", "membership", "membership-canaries", "common-knowledge-real", "demo"}
    for name in cited:
        assert (ROOT / "reports" / name).is_dir(), name
    bullets = EVIDENCE.read_text(encoding="utf-8").split("\n- ")[1:]
    for b in bullets:
        assert "record" in b and "seed" in b, b[:80]


def test_the_demo_report_is_current():
    for run in ("demo-audit", "demo-training"):
        doc = report(f"demo/{run}.json")
        assert doc["schema"] == "gnq-report/2"
        assert all(isinstance(r["independent_positives"], int) and not math.isnan(r["n"])
                   for r in doc["tables"])
