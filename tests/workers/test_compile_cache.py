"""JAX's persistent compilation cache: a second sweep of the same grid compiles nothing anew."""

from __future__ import annotations

import pytest

from workers.compile_cache import JAX_CACHE_DIR_ENV, default_jax_cache_dir, jax_cache_env
from workers.driver import run_sweep
from workers.options import DriverOptions

from .conftest import MemorySink, tiny_spec


def test_cache_env_turns_the_cache_on_or_off(monkeypatch):
    env = jax_cache_env("/tmp/x")
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/tmp/x"
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY"] == "true"
    assert jax_cache_env("") == {}
    monkeypatch.setenv(JAX_CACHE_DIR_ENV, "")
    assert default_jax_cache_dir() == "" and DriverOptions().jax_compile_cache_dir == ""
    monkeypatch.delenv(JAX_CACHE_DIR_ENV)
    assert default_jax_cache_dir().endswith("gdn-sweep/jax-compile")


@pytest.mark.slow  # two JAX trials in fresh processes, one compiling cold: ~25 s here
@pytest.mark.timeout(240)
def test_second_sweep_reuses_every_compiled_program(local_ray, tmp_path):
    cache = tmp_path / "jax-cache"
    spec = tiny_spec(frameworks=["jax"], modes=["p2p"], chips=[2], seq_lens=[64])
    options = DriverOptions(jax_compile_cache_dir=str(cache), reuse_workers=False)
    (first,) = run_sweep(spec, MemorySink(), options=options)
    assert first.status == "succeeded", first.error
    entries = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert any(name.startswith("jit_shard_step") for name in entries), sorted(entries)
    # A fresh process (reuse_workers=False) with the same grid: every program comes from the
    # cache, so no entry is added or rewritten.
    (second,) = run_sweep(spec, MemorySink(), options=options)
    assert second.status == "succeeded", second.error
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == entries
    assert second.metrics.loss_last == pytest.approx(first.metrics.loss_last, rel=1e-6)
