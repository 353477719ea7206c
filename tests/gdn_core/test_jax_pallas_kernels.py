"""JAX's fused GDN is the Pallas chunk rule (issue 39): what the resolvers name it on each
backend, and where it cannot run — a CPU without GDN_SWEEP_INTERPRET_KERNELS=1 — the reason a
skipped trial records (never the reference in its place)."""

from __future__ import annotations

import functools

import pytest

from gdn_core import kernels as K
from gdn_core.interpreted_kernels import INTERPRET_ENV
from gdn_core.jax_gdn.kernels import jax_gdn_rule_kernel, resolve_jax_gdn_kernel
from gdn_core.jax_gdn.pallas import KERNEL_NAME, chunk_gated_delta_rule_pallas
from gdn_core.kernels import KernelUnavailable, resolve_kernels

NO_CHIP = (r"the Pallas chunk rule needs a TPU or GPU; on a CPU set "
           r"GDN_SWEEP_INTERPRET_KERNELS=1 to run it through Pallas's interpreter")


@pytest.fixture
def interpret(monkeypatch):
    """Set (True) or unset (False) the interpreted-kernels switch for the test."""
    def switch(on: bool) -> None:
        if on:
            monkeypatch.setenv(INTERPRET_ENV, "1")
        else:
            monkeypatch.delenv(INTERPRET_ENV, raising=False)
    return switch


def test_the_stored_name_is_the_kernels_own():
    assert K.JAX_PALLAS_GDN == KERNEL_NAME == "gdn_core pallas chunk rule"


@pytest.mark.parametrize("backend, name", [
    ("tpu", "gdn_core pallas chunk rule (tpu)"), ("gpu", "gdn_core pallas chunk rule (gpu)"),
    ("cuda", "gdn_core pallas chunk rule (gpu)")])
@pytest.mark.parametrize("switch", [False, True], ids=["plain", "interpret-switch"])
def test_on_a_chip_the_rule_is_named_with_its_platform(interpret, backend, name, switch):
    interpret(switch)  # the switch concerns CPUs only
    assert K.jax_fused_gdn_name(backend) == name
    assert resolve_jax_gdn_kernel("fused", backend=backend) == name


def test_on_a_cpu_it_runs_interpreted_only_under_the_switch(interpret):
    interpret(True)
    assert K.jax_fused_gdn_name("cpu") == "gdn_core pallas chunk rule (interpreted)"
    interpret(False)
    with pytest.raises(KernelUnavailable, match=NO_CHIP):
        K.jax_fused_gdn_name("cpu")
    with pytest.raises(KernelUnavailable, match=NO_CHIP):
        resolve_jax_gdn_kernel("fused", backend="cpu")


@pytest.mark.parametrize("has_attention", [False, True], ids=["gdn_only", "hybrid"])
def test_the_rule_book_skips_a_fused_jax_point_on_a_cpu_without_the_switch(interpret,
                                                                          has_attention):
    """What a worker asks before it builds a trial (gdn_core.kernels.resolve_kernels): the
    whole point is refused with the Pallas reason, attention's name notwithstanding."""
    interpret(False)
    with pytest.raises(KernelUnavailable, match=NO_CHIP):
        resolve_kernels("jax", "fused", device_kind="cpu", dtype="float32", head_dim=16,
                        has_attention=has_attention)
    interpret(True)
    got = resolve_kernels("jax", "fused", device_kind="cpu", dtype="float32", head_dim=16,
                          has_attention=has_attention)
    assert got.gdn == "gdn_core pallas chunk rule (interpreted)"


@pytest.mark.parametrize("device_kind", ["gpu", "tpu"])
def test_the_rule_book_names_the_platform(interpret, device_kind):
    interpret(False)
    got = resolve_kernels("jax", "fused", device_kind=device_kind, dtype="bfloat16",
                          head_dim=128, has_attention=False)
    assert got.gdn == f"gdn_core pallas chunk rule ({device_kind})" and got.attention is None


def test_the_reference_needs_no_kernel_anywhere(interpret):
    interpret(False)
    for backend in ("cpu", "gpu", "cuda", "tpu"):
        assert jax_gdn_rule_kernel("reference", backend=backend) is None
        assert resolve_jax_gdn_kernel("reference", backend=backend) == "reference jax chunk rule"


@pytest.mark.parametrize("backend, platform, interpreted", [
    ("tpu", "tpu", False), ("gpu", "gpu", False), ("cuda", "gpu", False), ("cpu", None, True)])
def test_the_fused_kernel_callable_is_the_pallas_rule_bound_to_its_platform(
        interpret, backend, platform, interpreted):
    interpret(True)
    kernel = jax_gdn_rule_kernel("fused", backend=backend)
    assert isinstance(kernel, functools.partial)
    assert kernel.func is chunk_gated_delta_rule_pallas
    assert kernel.keywords == {"platform": platform, "interpret": interpreted}


def test_the_fused_kernel_callable_is_refused_where_the_name_is(interpret):
    interpret(False)
    with pytest.raises(KernelUnavailable, match=NO_CHIP):
        jax_gdn_rule_kernel("fused", backend="cpu")
    with pytest.raises(ValueError, match="kernels='fast' is not one of"):
        jax_gdn_rule_kernel("fast", backend="tpu")
