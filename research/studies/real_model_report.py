"""The real-model report (reports/real-model/run.sh): membership and extraction tables of a
fine-tuned SmolLM2-135M, read back from the store, with intervals, model hash, machine and time.

``python -m research.studies.real_model_report DB FOLDER --model PATH --seconds k=v,...``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.signals import signal_frame
from gnq_core.attacks.non_members import membership_frame
from gnq_core.results.store import Store
from gnq_core.sources.copies import find_copies
from gnq_core.sources.real_models import PROVENANCE
from research.studies import report as rep
from research.studies.base import machine

# (column, label, higher means member): fixed by each signal's meaning before any outcome is read;
# GNQ and K_jj follow the project's convention (higher = more at risk), which may point the wrong
# way for membership after training (an AUC below 0.5 says so).
MEMBERSHIP_SIGNALS = [("loss_last", "loss", False), ("min_k_prob", "Min-K%", True),
                      ("min_k_plus", "Min-K%++", True),
                      ("zlib_ratio", "zlib ratio", False),
                      ("loss_ratio", "loss ratio to the base model", False),
                      ("gnq_last", "GNQ (post hoc, last checkpoint)", True),
                      ("self_influence_last", "gradient norm² ‖g‖² (K_jj)", True),
                      ("reference_loss", "control: the base model's loss", False),
                      ("n_tokens", "control: text length", False)]


def membership_table(frame: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per signal: AUC and TPR at each low FPR of members vs non-members, with intervals whose
    unit is the record: copies (``cluster_id``; found here when the frame has none) resampled
    together, "too few" under ``clusters.MIN_RECORDS`` independent records of either side."""
    if cl.CLUSTER not in frame.columns:
        found = find_copies(frame["text"].astype(str).tolist())
        frame = frame.assign(**{cl.CLUSTER: found[cl.CLUSTER].to_numpy()})
    y_all = frame["member"].to_numpy(bool)
    groups_all = cl.groups_of(frame)
    columns = {"AUC [95% CI]": "auc"} | {f"TPR at {a:.1%} FPR": f"tpr@{a:g}" for a in pr.FPR_LEVELS}
    rows = []
    for column, label, higher in MEMBERSHIP_SIGNALS:
        s = pd.to_numeric(frame[column], errors="coerce").to_numpy(float) * (1 if higher else -1)
        keep = np.isfinite(s)
        s, y, g = s[keep], y_all[keep], groups_all[keep]
        if not 0 < y.sum() < len(y):
            continue
        pos, neg = cl.records(y, g)
        row = {"signal": label, "direction": "higher" if higher else "lower", "members": int(y.sum()),
               "non-members": int((~y).sum()), "member records": pos, "non-member records": neg}
        if cl.too_few(y, g):
            rows.append(row | dict.fromkeys(columns, cl.TOO_FEW))
            continue
        cells, _ = pr.metrics_with_intervals(s, y, g, pr.RESAMPLES, seed, fractions=())
        rows.append(row | {name: rep.ci(cells[k], cells[f"{k} lo"], cells[f"{k} hi"])
                           for name, k in columns.items()})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("folder")
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--command", default="reports/real-model/run.sh")
    args = parser.parse_args(argv)
    store = Store(args.db)
    train, audit = store.run("real-ft"), store.run("real-ft-last")
    provenance = json.loads((Path(args.model) / PROVENANCE).read_text(encoding="utf-8"))
    seconds = dict(kv.split("=") for kv in args.seconds.split(",") if kv)
    frame = membership_frame(store, audit)
    metrics = pd.concat([store.metrics(r.run_id).assign(run_id=r.run_id) for r in
                         (audit, store.run("real-ft-last.non-members"))])
    frame = frame.merge(metrics.rename(columns={"example_id": "run_example_id"})[
        ["run_id", "run_example_id", "reference_loss"]], on=["run_id", "run_example_id"], how="left")
    r = rep.Report(Path(args.folder), "Real model: SmolLM2-135M-Instruct fine-tuned on CPU")
    r.text(f"""Model: {provenance['model']} from `{provenance['package']}` (wheel sha256
`{provenance['wheel_sha256']}`), model.safetensors sha256 `{provenance['model_sha256']}`.
Fine-tune: `gnq train --init` on {train.n_examples} AG News rows (a seeded random half of
{2 * train.n_examples}; the other half are the non-members), {train.settings.get('epochs')} epochs,
batch {train.batch_size}, AdamW lr {train.settings.get('lr')}, max length {train.max_length} tokens,
λ = {train.lam}, in-run GNQ. Machine: {machine("cpu")}; load average when this report was written
{', '.join(f'{v:.1f}' for v in os.getloadavg())} (the 2 cores are shared by other jobs). Wall time:
{', '.join(f'{k} {int(v) / 60:.1f} min' for k, v in seconds.items())}.""")
    r.text(f"""## Membership: members vs held-out non-members at the last checkpoint

`gnq audit --non-members` at {frame['label'].iloc[0]}: members and non-members each audited post
hoc in batches of their own kind (GNQ of a non-member: how unique its gradient is among other
non-members at that checkpoint). Reference for the loss ratio: the base model.""")
    membership = membership_table(frame, args.seed)
    r.table(membership, caption="AUC: P(a member scores higher than a non-member in "
            "the stated direction, ties ½); TPR at x% FPR: share of members caught while flagging at most x% "
            f"of the non-members (with {int((~frame['member']).sum())} non-members, 0.1% and 1% FPR both "
            "mean no non-member flagged). " + pr.interval_method(pr.RESAMPLES, args.seed, pr.LEVEL))
    ratio = store.scores(train.run_id).eval("gnq * @train.lam / self_influence")
    r.text("## What GNQ is on this run\n\n" + rep.ratio_sentence(ratio))
    totals = signal_frame(store, train)
    attacked = totals[totals["extracted"].notna()]
    result = pr.evaluate(attacked, resamples=pr.RESAMPLES, seed=args.seed)
    rate, lo, hi = pr.rate_interval(attacked["extracted"].astype(bool))
    r.text(f"""## Extraction on the training run (12-token prefix, exactly 8 more, base model as reference)

{len(attacked)} members attacked; {int(attacked['extracted'].sum())} extracted (rate {rep.ci(rate, lo, hi)},
Wilson interval over texts). Predictive power of each signal for the attack's outcome:""")
    r.table(pr.display_table(result), caption=result.method())
    r.text(f"## Reproduce\n\n```\n{args.command}\n```\n\nThe runs are ordinary runs in the store (`real-ft`, "
           "`real-ft-last`, `real-ft-last.non-members`): open them on the dashboard.")
    out = Path(args.folder) / "report.md"
    out.write_text("\n\n".join(r.blocks) + "\n", encoding="utf-8")
    (Path(args.folder) / "results.json").write_text(json.dumps(
        {"model_sha256": provenance["model_sha256"], "seconds": seconds, "machine": machine("cpu"),
         "membership": membership.to_dict("records"),
         "gnq_lambda_over_kjj_median": float(ratio.median()),
         "extraction": result.table.to_dict("records")}, indent=2, default=str) + "\n", encoding="utf-8")
    print(out)
    return out


if __name__ == "__main__":
    main()
