#!/usr/bin/env bash
# Sets up (if needed), executes every notebook and writes it as a static HTML page into site/
# (outputs, charts, widgets as their final state). Arguments go to `python -m tools.render`:
# notebook names to render only those, --out DIR for another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh lab,test
exec .venv/bin/python -m tools.render "$@"
