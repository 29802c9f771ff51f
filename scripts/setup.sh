#!/usr/bin/env bash
# Creates .venv at the repo root and installs devlab with the extras named in $1 (comma-separated,
# default `lab,test`): `setup.sh lab` is what a learner's lessons use (scripts/lab.sh), `setup.sh
# lab,test` adds the test suite's tools and the frameworks the conformance corpus runs
# (scripts/test.sh). Each extra leaves its own stamp, so that test.sh after lab.sh installs the rest
# and lab.sh after test.sh installs nothing.
# torch is pinned to the CPU build first so that resolving devlab's `torch>=2.11,<2.16`
# installs nothing more (a bare `torch` requirement would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${DEVLAB_TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${1:-lab,test}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stale=0
IFS=, read -ra names <<<"$EXTRAS"
for name in "${names[@]}"; do
    stamp=".venv/.devlab-installed-$name"
    # build_backend/: the start-up hook's .pth line is written into the install by it.
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
        || [ build_backend/devlab_build.py -nt "$stamp" ]; then stale=1; fi
done
if [ "$stale" = 1 ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
    .venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (devlab)" >/dev/null
    for name in "${names[@]}"; do touch ".venv/.devlab-installed-$name"; done
fi
# ipywidgets 7.7 (what Colab ships) in its own folder: the widget tests run under it too.
if [[ ",$EXTRAS," == *,test,* ]] && [ ! -f .venv/ipywidgets7/ipywidgets/__init__.py ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
        --target .venv/ipywidgets7 "ipywidgets==7.7.5" "ipython_genutils==0.2.0"
fi
