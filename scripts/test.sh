#!/usr/bin/env bash
# Sets up (if needed), then runs ruff and the whole test suite, notebooks and browser test included,
# in parallel on every core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh lab,test
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the browser test" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
.venv/bin/ruff check devlab tests benchmarks tools
# The suite's tiers (notebooks in every environment, the corpus, Binder, the browser) are
# independent: pytest-xdist runs them on every core (DEVLAB_TEST_WORKERS to choose, 0 for none).
# Workers, kernels and ranks together run more threads than there are cores: OpenMP's threads
# then sleep while they wait instead of spinning (a 100x100 product took 1.1 ms spinning, 0.23 ms
# so, at a load of 8 on 2 cores; lesson 03 in 158 s before, 30 s after).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec .venv/bin/python -m pytest -n "${DEVLAB_TEST_WORKERS:-auto}" --dist loadgroup --durations=25 "$@"
