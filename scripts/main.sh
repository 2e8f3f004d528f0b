#!/usr/bin/env bash
# Set up, then run the default crossover experiment; results land in results/crossover/:
# the CSVs, summary.json, the plots and report.html (the analysis writes the report last).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
if [ ! -f models/default-pair/manifest.json ]; then
  echo "main: models/default-pair is missing; building it (about 5 minutes)" >&2
  .venv/bin/dsdbed build-pair --out models/default-pair
fi
exec .venv/bin/dsdbed crossover --out "${OUT:-results/crossover}" "$@"
