"""What a worker process reports about itself: memory high-water mark, caps, cgroup counters."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from workers import process_probe


@pytest.mark.timeout(60)
def test_address_space_cap_fails_allocations_then_restores():
    code = textwrap.dedent("""
        from workers.process_probe import address_space_cap
        with address_space_cap(64 << 20):
            try:
                bytearray(512 << 20)
                raise SystemExit("allocation past the cap succeeded")
            except MemoryError:
                pass
        bytearray(512 << 20)  # the soft limit is back
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=50)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.timeout(30)
def test_oom_kill_counter_and_versions():
    path, count = process_probe.oom_kill_counter()
    if path is None:
        pytest.skip("no memory cgroup with an oom_kill counter here")
    assert count >= 0 and process_probe.read_oom_kills(path) >= count
    versions = process_probe.software_versions()
    assert set(versions) == {"python", "torch", "jax", "jaxlib", "ray", "gdn-sweep"}
    assert 1024 <= process_probe.free_port() <= 65535
