#!/usr/bin/env bash
# Sets up (if needed), then runs ruff and the whole test suite, notebooks and browser test included,
# in parallel on every core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the browser test" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
.venv/bin/ruff check devlab tests benchmarks tools
# The suite's tiers (notebooks in every environment, the corpus, Binder, the browser) are
# independent: pytest-xdist runs them on every core (DEVLAB_TEST_WORKERS to choose, 0 for none).
exec .venv/bin/python -m pytest -n "${DEVLAB_TEST_WORKERS:-auto}" --dist loadgroup --durations=25 "$@"
