#!/usr/bin/env bash
# Install gdn-sweep, then train the tiny demo model on one chip in both frameworks and print metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
gdn-sweep train --preset tiny --framework torch --seq-len 512 --steps 30
gdn-sweep train --preset tiny --framework jax --seq-len 512 --steps 30
