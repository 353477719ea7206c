#!/usr/bin/env bash
# Install gdn-sweep with its test extras into the current Python, then run the default suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
# tests/service/test_dashboard.py drives Debian's chromium through Playwright (no browser
# download): install it when it is missing.
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
exec python3 -m pytest "$@"
