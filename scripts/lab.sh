#!/usr/bin/env bash
# Sets up (if needed) and opens JupyterLab on notebooks/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh lab
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --notebook-dir=notebooks "${extra[@]}" "$@"
