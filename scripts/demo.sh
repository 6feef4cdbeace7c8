#!/usr/bin/env bash
# Sets up from nothing and runs the main job: Qwen3 on the flagos device,
# compared with the CPU (host driver) or native CUDA (cuda driver).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd /tmp && "$VENV/bin/python" "$ROOT/examples/qwen3_demo.py" "$@"
