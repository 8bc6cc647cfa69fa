"""What the auditor decides before its first audited batch: which tensors carry the batch
(``batch``, ``frontier``), which kernel covers which parameters (``assignment``) and whether
anything escapes (``coverage``), the first batch's probe plan (``planning``) kept for the next
checkpoint (``plan_reuse``), and the refusal of compiled modules (``compiled``).

Above the kernels and the math, below the passes that carry the plan out."""
