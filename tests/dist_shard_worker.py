"""One rank of tests/pipelines/test_audit_sharded.py: ``gnq audit --shard-model`` under torchrun.

Runs the CLI as torchrun starts it, and saves to ``OUT/rank{r}.json`` what this rank held and
ran: the parameters of its shard against the model's (``sharding.local_numel`` right after
``sharding.shard``) and, per checkpoint, how many batches it ran and how many of them were
lockstep copies whose rows were dropped.
Usage: dist_shard_worker.py OUT gnq-audit-arguments...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gnq_core.pipelines import audit, sharding


def main(out: Path, argv: list[str]) -> None:
    seen: dict = {"held": [], "passes": []}
    shard, audit_batches = audit.shard, audit.audit_batches

    def recorded_shard(model, mesh):
        blocks = shard(model, mesh)
        held, total = sharding.local_numel(model)
        seen["held"].append({"held": held, "total": total, "blocks": blocks})
        return blocks

    def recorded_batches(*args, **kwargs):
        seen["passes"].append({"runs": list(kwargs["indices"]), "padding": kwargs["padding"]})
        return audit_batches(*args, **kwargs)

    audit.shard, audit.audit_batches = recorded_shard, recorded_batches
    from gnq_core.cli import app

    try:
        app(argv, standalone_mode=False)
    finally:
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
