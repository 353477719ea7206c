#!/usr/bin/env bash
# Install gdn-sweep with its test extras into the current Python, then run the default suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
exec python3 -m pytest "$@"
