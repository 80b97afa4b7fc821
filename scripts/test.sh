#!/usr/bin/env bash
# Runs vime's test suite, installing what it needs first (scripts/setup.sh).
#   usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "[test] running pytest $*"
exec .venv/bin/python -m pytest "$@"
