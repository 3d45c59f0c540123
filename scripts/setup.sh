#!/usr/bin/env bash
# Sets up the console on a fresh machine: .venv with the console's packages and the embedded model converted once.
#   bash scripts/setup.sh          the app
#   bash scripts/setup.sh --dev    the app plus what the tests need: pytest, Playwright with Debian's Chromium,
#                                  Debian's prometheus, and vLLM's CPU build in its own environment (.venv-vllm)
# Safe to run again: finished steps are skipped quickly.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
[ "${1:-}" = "--dev" ] && DEV=1
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first and alone, so pip takes the pinned CPU build instead of resolving a CUDA build for other packages.
.venv/bin/python -m pip install -q "torch==2.13.0"
if [ "$DEV" = 1 ]; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
else
  .venv/bin/python -m pip install -q -r requirements.txt
fi

echo "== embedded model (converted once, then cached)"
.venv/bin/python -c "import sys; sys.path.insert(0, '.'); from core.models import embedded_model_dir; print(embedded_model_dir(lambda f, m: print(f'  {f:4.0%} {m}', flush=True)))"

if [ "$DEV" = 1 ]; then
  if [ ! -x /usr/bin/chromium ]; then
    echo "== Debian's chromium for the browser tests"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q chromium chromium-driver >/dev/null
  fi
  if [ ! -x /usr/bin/prometheus ]; then
    # The fleet tests start their own Prometheus (temporary config and TSDB, loopback); the system service is not used.
    echo "== Debian's prometheus for the fleet tests"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q prometheus >/dev/null
  fi
  bash scripts/setup_vllm.sh
fi
echo "== setup done"
