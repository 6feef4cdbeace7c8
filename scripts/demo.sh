#!/usr/bin/env bash
# Sets up from nothing and runs the main job on the flagos device.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd /tmp && "$VENV/bin/python" "$ROOT/examples/train_mlp.py" "$@"
