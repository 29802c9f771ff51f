#!/usr/bin/env bash
# Sets up (if needed), then runs ruff and the whole test suite, notebooks and browser test included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the browser test" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
.venv/bin/ruff check devlab tests benchmarks tools
exec .venv/bin/python -m pytest "$@"
