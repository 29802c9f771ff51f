#!/usr/bin/env bash
# The compatibility job: devlab's unit tests and one notebook on one torch version, in a fresh
# .venv-compat-* environment. Usage: bash scripts/compat.sh TORCH_SPEC [CHECKOUT]
# Or every lesson in a Colab-like environment: bash scripts/compat.sh --colab [CHECKOUT]
# (tools/compat.py says more). Needs Python 3 and pip's registry; --colab also Python 3.12
# and this repository's .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m tools.compat "$@"
