#!/usr/bin/env bash
# Install gdn-sweep with its test extras into the current Python, then run the default suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
# tests/service/test_dashboard.py drives Debian's chromium through Playwright (no browser
# download); tests/deploy/test_ray_submit.py (slow) reaches a Ray head over Debian's sshd (a
# private one it starts itself): install them when missing.
if ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/sbin/sshd ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium openssh-server \
        >/dev/null
fi
# Two workers (pytest-xdist), a test file each at a time (its module fixtures stay in one
# process): Ray trials, browsers and servers mostly wait, so a JAX compile runs beside them.
# `-n 0` (or GDN_SWEEP_TEST_WORKERS=0) runs in one process.
exec python3 -m pytest -n "${GDN_SWEEP_TEST_WORKERS:-2}" --dist loadfile "$@"
