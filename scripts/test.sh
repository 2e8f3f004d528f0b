#!/usr/bin/env bash
# Set up, then run the whole test suite. Tests that need root, Docker or the built model pair
# run when those are present; the summary says which were skipped and why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
