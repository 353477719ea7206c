#!/usr/bin/env bash
# Install gdn-sweep, then start the service (SQLite + a local Ray), submit the demo sweep, print
# the dashboard URL, and when the sweep has finished, the URL of its results. Ctrl-C stops it;
# running it again resumes unfinished trials. Options go to `python -m service.demo`:
# --port N (default 8000), --host H, --db URL, --smoke.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    echo "note: no virtual environment is active: installing into $(command -v python3)'s" \
         "packages (python3 -m venv .venv && source .venv/bin/activate first keeps them apart)" >&2
fi
python3 -m pip install -q -e .
exec python3 -m service.demo "$@"
