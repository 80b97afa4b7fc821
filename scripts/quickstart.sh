#!/usr/bin/env bash
# Sets everything up and runs vime's main job on this machine.
#   usage: scripts/quickstart.sh [vime flags]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "[quickstart] GRPO on the tiny model: embedded Temporal + vLLM + rollout worker + FSDP2 trainer"
exec .venv/bin/python -m examples.quickstart.run "$@"
