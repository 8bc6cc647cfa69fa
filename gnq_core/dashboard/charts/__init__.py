"""Plotly figure builders for the dashboard: pure functions from frames/arrays to figures.

No Streamlit here; every builder returns a ``plotly.graph_objects.Figure`` and never raises on
empty input (it answers a figure saying "no data").  Conventions shared by all builders:

* ``customdata[0]`` of every per-example trace is the example id (for the §4 regression
  figures: the point's 0-based index), so a click or a box selection maps back to an example.
  Aggregate marks (histogram bars, quantile bins) carry their highest-scoring example's id
  there (``None`` for an empty bin), followed by the text and the aggregate's own numbers.
* Texts, group names and point labels are user data: they go into hover labels only as
  HTML-escaped strings (``<``, ``>``, ``&``), shortened to ``TEXT_LIMIT`` characters.
* An axis is logarithmic when its values are all positive and span more than a factor 100
  (``use_log``); builders take an explicit override where that matters.
* No template or background of their own (the dashboard's theme draws them, light or dark) and
  one group → colour map (``group_colors``) for all figures.
"""

from gnq_core.dashboard.charts.compare import run_comparison
from gnq_core.dashboard.charts.extraction import extraction_vs_quantile
from gnq_core.dashboard.charts.groups import group_distributions
from gnq_core.dashboard.charts.regression import gradient_space, ranking_comparison, regression_data
from gnq_core.dashboard.charts.runs import gnq_histogram, gnq_vs_loss
from gnq_core.dashboard.charts.trajectories import example_trajectory, secret_tracking, trajectories

__all__ = ["example_trajectory", "extraction_vs_quantile", "gnq_histogram", "gnq_vs_loss", "gradient_space",
           "group_distributions", "ranking_comparison", "regression_data", "run_comparison",
           "secret_tracking", "trajectories"]
