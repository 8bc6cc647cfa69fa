"""Built-in studies reproducing the paper's findings (§6) on small models trained here.

Each study is one module with a ``run(ctx, ...)`` that trains/audits/attacks through the engine
(every step resumable, results in the store as ordinary runs) and writes a Markdown report with
PNG figures to ``reports/NAME/``:

* ``common_knowledge`` — GNQ of known facts vs. surprising false claims (§6.2, Fig. 3–4);
* ``extraction``       — targeted prefix-completion attack by GNQ / counterfactual / loss / random
  (§6.3, Table 3);
* ``trajectories``     — GNQ over checkpoints of a long training run, GNQ_total quantile bins
  (§6.4, Fig. 5–6, Table 4);
* ``membership``       — leave-half-out membership: per-model membership AUC of each signal, which
  signal predicts a text's in/out loss separation, canaries with exposure;
* ``real_model_report`` — the report of reports/real-model/run.sh (SmolLM2-135M fine-tuned on CPU).
"""

from research.studies.base import StudyContext

__all__ = ["StudyContext"]
