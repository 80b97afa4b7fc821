#!/usr/bin/env bash
# Sets everything up and runs vime's main job on this machine.
#   usage: scripts/quickstart.sh [vime flags]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "[quickstart] vime smoke: embedded Temporal + vLLM on the tiny model (the RL quickstart lands with issue #3)"
exec .venv/bin/vime smoke --run-dir runs/smoke "$@"
