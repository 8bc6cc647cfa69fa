"""Seeded random projections of per-example gradients (``projection``: formed without the
gradients, DESIGN.md §9) and GNQ of each text against a companion set from those sketches
(``companions``).  Above the math, below the passes.

``gnq_core.engine.sketch`` was one module; its public names are still importable from here."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".projection": ("DEFAULT_BLOCK", "DEFAULT_COLUMNS", "DEFAULT_K", "DEFAULT_TOTAL", "DEFAULT_VOCAB_COLS",
                    "DEFAULT_VOCAB_ROWS", "SHARED", "Projection", "SketchBatch", "SketchSpec", "Sketcher",
                    "sketched_gnq", "vocab_keys", "weight_matrices"),
    "": ("companions", "projection"),
})
