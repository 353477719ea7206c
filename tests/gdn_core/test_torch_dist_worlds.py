"""The gloo worlds the torch tests share (torch_dist.py) never outlive the test process that
spawned them, even one that ends without running atexit (as a pytest-xdist worker can): left
behind, a world's ranks wait for jobs forever and hold memory and cores across CI runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPAWN_AND_VANISH = """
import os, sys
from pathlib import Path
from tests.gdn_core.torch_dist import noop_job, run_in_process_group, _worlds
assert run_in_process_group(noop_job, world_size=2, timeout_s=60) == [0, 1]
Path(sys.argv[1]).write_text(" ".join(str(p.pid) for p in _worlds[2].processes))
os._exit(0)  # no atexit: the world is never closed
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) is gone for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


@pytest.mark.timeout(90)
def test_a_world_ends_with_the_process_that_spawned_it(tmp_path):
    pids = tmp_path / "ranks"
    # no pipes: a rank left behind would hold them open
    done = subprocess.run([sys.executable, "-c", SPAWN_AND_VANISH, str(pids)], cwd=REPO,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=80)
    assert done.returncode == 0
    ranks = [int(pid) for pid in pids.read_text().split()]
    assert len(ranks) == 2
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in ranks if _alive(pid)]
    for pid in left:
        os.kill(pid, 9)
    assert not left, "ranks outlived their test process"
