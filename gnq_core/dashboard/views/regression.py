"""GNQ explained: the paper's 2D regression (§4, Fig. 1), interactive.

y = w·x + b with squared loss; each point's gradient g_j = −r_j·[x_j, 1] lives in a 2D plane.
GNQ_j = g_jᵀ S_{−j}⁻¹ g_j: above 1 exactly when g_j lies outside the ellipse spanned by the
other points' gradients (plus λI).  A loss threshold instead flags points by |r_j| alone.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from gnq_core.analysis import regression2d as r2d
from gnq_core.dashboard import charts, show

st.title("GNQ explained: 2D regression")
st.markdown(
    "Each training point pulls the model with its gradient. **GNQ asks whether that pull could be "
    "explained by the other points' pulls**: it measures g_j against the ellipse "
    "{g : gᵀ S₋ⱼ⁻¹ g = 1} of the others (S₋ⱼ = Σ_{k≠j} g_k g_kᵀ + λI). Outside the ellipse (GNQ > 1), "
    "the others' pulls do not explain this one: a direction only this point pushes, in this toy model "
    "(on language models' runs a large GNQ did not mark what was memorised beyond length, loss, copies "
    "and the gradient norm). A loss threshold τ instead flags every "
    "point whose residual is large — the horizontal strip |∂ℓ/∂b| ≤ √(2τ) in gradient space.")

default_text = "\n".join(f"{x:g}, {y:g}" for x, y in zip(r2d.DEFAULT_X, r2d.DEFAULT_Y, strict=True))
left, right = st.columns([1, 2])
with left:
    text = st.text_area("Points (x, y per line) — edit freely", value=default_text, height=200)
    try:
        x, y = r2d.parse_points(text)
    except ValueError as exc:
        st.error(str(exc))
        st.stop()
    w = st.slider("Model slope w", -5.0, 5.0, float(round(r2d.DEFAULT_W, 2)), 0.05)
    b = st.slider("Model intercept b", -5.0, 5.0, float(round(r2d.DEFAULT_B, 2)), 0.05)
    log_lam = st.slider("log₁₀ λ", -6.0, 2.0, float(np.log10(r2d.DEFAULT_LAM)), 0.25)
    lam = 10 ** log_lam
    tau = st.slider("Loss threshold τ", 0.0, 5.0, r2d.DEFAULT_TAU, 0.05)
    selected = st.selectbox("Selected point", list(range(len(x))),
                            index=min(r2d.DEFAULT_OUTLIER, len(x) - 1),
                            format_func=lambda j: f"#{j}  ({x[j]:g}, {y[j]:g})")
    show_others = st.toggle("Show the other points' ellipses", value=False)

G = r2d.gradients(x, y, w, b)
scores = r2d.gnq(G, lam)
table = r2d.rankings(x, y, w, b, lam, tau)
ellipse_sel = r2d.ellipse(r2d.leave_one_out_matrix(G, selected, lam))
others = ({j: r2d.ellipse(r2d.leave_one_out_matrix(G, j, lam)) for j in range(len(x)) if j != selected}
          if show_others else None)
with right:
    c1, c2 = st.columns(2)
    show.chart(charts.regression_data(x, y, w, b, selected, scores, label_offset=0), c1, width="stretch")
    show.chart(charts.gradient_space(G, selected, ellipse_sel, others, r2d.loss_strip_halfwidth(tau),
                                     label_offset=0), c2, width="stretch")
    show.chart(charts.ranking_comparison(scores, r2d.losses(x, y, w, b), label_offset=0), width="stretch")

st.subheader("Per point")
st.dataframe(table, hide_index=True, width="stretch")
j = selected
verdict = "outside" if scores[j] > 1 else "inside"
st.caption(f"Point #{j}: GNQ = {scores[j]:.3g}, so its gradient lies {verdict} the ellipse of the others "
           f"(λ = {lam:.2g}); loss = {r2d.losses(x, y, w, b)[j]:.3g} vs τ = {tau:g}.")
