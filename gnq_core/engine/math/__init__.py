"""The engine's mathematics, on tensors and nothing else: per-example gradient representations and
their Gram blocks (``grams``, ``cost_model``: which way a block is formed; ``cpu_gram`` and
``numba_gram``: the CPU's one-pass upper triangle), the loss convention GNQ is defined with
(``losses``, ``conventions``), K -> GNQ (``solve``), the float64 reference from explicit
per-example gradients (``reference``) and how close a path must come to it (``tolerance``).

The bottom wing of the engine: it imports no other part of it."""
