"""A benchmark run in-process must not lower the virtual chip count its caller asked for: CI's
session asks for 8, and `bench cp --chips 2` running first once left every later test 2."""

import subprocess
import sys

import pytest

SCRIPT = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
from gdn_core.jax_gdn.virtual_chips import ensure_virtual_chips
ensure_virtual_chips(2, fresh_process="python -m gdn_core.bench cp")
print(len(jax.devices()))
"""


@pytest.mark.timeout(120)
def test_a_smaller_benchmark_keeps_the_callers_chip_count():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True, timeout=110).stdout
    assert out.split() == ["8"]
