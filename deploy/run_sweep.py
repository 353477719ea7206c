"""Run a sweep on the Ray cluster this script runs on: `gdn-sweep run` for cluster heads.

    ray submit deploy/<cluster>.yaml deploy/run_sweep.py -- deploy/sweeps/nightly-h100.yaml \
        --db postgresql://user@db-host:5432/gdn_sweep
    ray job submit --address http://HEAD:8265 --working-dir . -- \
        python deploy/run_sweep.py deploy/sweeps/nightly-h100.yaml --db postgresql://...

Every run is a new sweep (its own id and date), unless `--resume SWEEP_ID` (with --db) or
`--resume FILE` (with --jsonl) finishes an interrupted one. Ray: --address, else $RAY_ADDRESS
(`ray job submit` sets it), else `auto` (the cluster of this head); it never starts a Ray of
its own. `--help` for every option; the driver is the CLI's (service/cli/main.py).
"""

import sys
from pathlib import Path

# Run from a checkout (or `ray job submit --working-dir .`): this checkout's code, whatever
# else is installed; the copy `ray submit` puts on a head alone uses the installed package.
_CHECKOUT = Path(__file__).resolve().parents[1]
if (_CHECKOUT / "service" / "__init__.py").is_file() and str(_CHECKOUT) not in sys.path:
    sys.path.insert(0, str(_CHECKOUT))

from service.cli.main import cluster_main  # noqa: E402 - after the path above

if __name__ == "__main__":
    sys.exit(cluster_main())
