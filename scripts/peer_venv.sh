#!/usr/bin/env bash
# The peer load generator for benchmarks/openai_peer.py: NVIDIA AIPerf in a venv of its own
# (.venv-peer). Not an extra of the project: aiperf pins pandas~=2.3.3 (the project runs pandas 3)
# and pulls some 140 packages (dash, optuna, kubernetes, ...), none of them the project's. No
# torch, no GPU build. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-peer/bin/python ]; then
  "$PYTHON" -m venv .venv-peer
fi
.venv-peer/bin/python -m pip install -q "aiperf==${AIPERF_VERSION}"
.venv-peer/bin/aiperf --version
