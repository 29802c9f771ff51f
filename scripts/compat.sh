#!/usr/bin/env bash
# The compatibility job: devlab's unit tests and one notebook on one torch version, in a fresh
# .venv-compat-* environment. Usage: bash scripts/compat.sh TORCH_SPEC [CHECKOUT]
# (tools/compat.py says more). Needs only Python 3 and pip's registry.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m tools.compat "$@"
