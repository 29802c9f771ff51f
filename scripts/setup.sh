#!/usr/bin/env bash
# Creates .venv at the repo root and installs devlab with its extras.
# torch is pinned to the CPU build first so that resolving devlab's `torch>=2.11,<2.16`
# installs nothing more (a bare `torch` requirement would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${DEVLAB_TORCH_SPEC:-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.devlab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[lab,test]"
    .venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (devlab)" >/dev/null
    touch "$stamp"
fi
# ipywidgets 7.7 (what Colab ships) in its own folder: the widget tests run under it too.
if [ ! -f .venv/ipywidgets7/ipywidgets/__init__.py ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
        --target .venv/ipywidgets7 "ipywidgets==7.7.5" "ipython_genutils==0.2.0"
fi
