#!/usr/bin/env bash
# Real-model membership and extraction (issue 25, item 8 at real-model scale), on CPU, 1 thread:
# fine-tune SmolLM2-135M-Instruct (gnq model fetch smollm2) with in-run GNQ on MEMBERS AG News rows,
# audit its last checkpoint on the members and on as many held-out rows (--non-members, the base
# model as reference), attack the members (12/8, base model as reference), and write report.md.
# Usage: reports/real-model/run.sh [WORK_DIR]
#   (env: MEMBERS=96 EPOCHS=3 LR=1e-4 MAXLEN=32; DATA_DIR: the shared data, default ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-${TMPDIR:-/tmp}/gnq-real-model}
MEMBERS=${MEMBERS:-96}; EPOCHS=${EPOCHS:-3}; LR=${LR:-1e-4}; MAXLEN=${MAXLEN:-32}
PY=${PY:-python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$WORK"
DB="$WORK/gnq.duckdb"
START=$(date +%s)
MODEL=$($PY -m gnq_core.cli model fetch smollm2 --quiet)
$PY - "$WORK" "$MEMBERS" "${DATA_DIR:-}" <<'PYEOF'
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from research.studies.base import DEFAULT_DATA_DIR, ag_news

work, n = Path(sys.argv[1]), int(sys.argv[2])
data = Path(sys.argv[3]) if sys.argv[3] else DEFAULT_DATA_DIR
rows = [t for t, _ in ag_news(data, 2 * n)]
order = np.random.default_rng(25).permutation(len(rows))  # a seeded random half: members
pd.DataFrame({"text": [rows[i] for i in order[:n]]}).to_csv(work / "members.csv", index=False)
pd.DataFrame({"text": [rows[i] for i in order[n:]]}).to_csv(work / "non-members.csv", index=False)
PYEOF
T0=$(date +%s)
$PY -m gnq_core.cli train --init "$MODEL" --data "$WORK/members.csv" --out "$WORK/ft" --name real-ft \
    --epochs "$EPOCHS" --batch-size 16 --lr "$LR" --max-length "$MAXLEN" --db "$DB" --threads 1 --quiet
T1=$(date +%s)
$PY -m gnq_core.cli audit --checkpoints "$WORK/ft/epoch-$EPOCHS" --data "$WORK/members.csv" --name real-ft-last \
    --non-members "$WORK/non-members.csv" --reference "$MODEL" --batch-size 16 --max-length "$MAXLEN" \
    --db "$DB" --threads 1 --quiet
T2=$(date +%s)
$PY -m gnq_core.cli extract --run real-ft --reference "$MODEL" --prefix-tokens 12 --suffix-tokens 8 \
    --db "$DB" --threads 1 --quiet
T3=$(date +%s)
$PY -m research.studies.real_model_report "$DB" reports/real-model \
    --model "$MODEL" --seconds "train=$((T1-T0)),audit=$((T2-T1)),extract=$((T3-T2)),total=$((T3-START))" \
    --command "MEMBERS=$MEMBERS EPOCHS=$EPOCHS LR=$LR MAXLEN=$MAXLEN reports/real-model/run.sh"
