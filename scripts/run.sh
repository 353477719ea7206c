#!/usr/bin/env bash
# Install gdn-sweep, then start the service (SQLite + a local Ray), submit the demo sweep and
# print the dashboard URL. Ctrl-C stops it; running it again resumes unfinished trials.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
exec python3 -m service.demo "$@"
