"""The audited forward/backward passes: the hooks on the user's own passes (``hooks``), one pass's
bookkeeping and tied weights' cross terms (``pass_state``), the steps a subclass overrides to
change what the batch is (``extension_points``), fused layers' reports (``fused_sink``), forwards
run again under activation checkpointing (``recompute``), the first batch's checks
(``first_batch``), and the auditors built on them: per micro-batch (``micro``), per optimizer
step (``window``) and across torch.distributed ranks (``distributed``, ``window_ddp``).

The top wing of the engine below ``engine.auditor``: it imports the plan, the kernels, the
sketches and the math."""
