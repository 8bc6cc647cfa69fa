"""The companions sketch-error benchmark compares the same quantity on both sides: with an
identity-sized sketch the production path (``audit_companions``) must give the exact GNQ of its
companion sets, and the exact Gram must be ``engine.math.reference``'s torch.func gradients' Gram."""

from __future__ import annotations

import pytest

from benchmarks.sketch_error_companions import parser, run, sizes
from research.studies.base import DEFAULT_DATA_DIR


@pytest.mark.skipif(not (DEFAULT_DATA_DIR / "ag_news" / "train_2000.csv").is_file(),
                    reason="../shared/data (AG News) is not here")
def test_identity_sketch_gives_the_exact_gnq_at_every_companion_size():
    args = sizes(parser().parse_args(["--quick", "--corpus", "24", "--records", "3", "--copies", "3",
                                      "--sizes", "6", "all", "--check-texts", "4"]))
    result = run(args)
    assert result["exact_vs_torch_func_max_rel"] < 1e-12
    assert {r["c"] for r in result["rows"]} == {6, "all"}
    for row in result["rows"]:
        errors = row["all"]
        assert errors["texts"] >= 7  # the texts of the full sets, copies among them
        assert errors["gnq_rel_max"] < 1e-10, row
        assert errors["share_explained_abs_error_p95"] < 1e-10, row
        assert row["record copies"]["texts"] > 0
