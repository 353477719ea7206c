"""The kernels dimension's resolver (gdn_core.kernels.resolve_kernels): what each framework runs
under reference and fused on each device, and the reasons a fused point is skipped — each
naming what was asked and what the kernel accepts, never a silent fallback to the reference."""

from __future__ import annotations

import pickle
from importlib import metadata

import pytest

from gdn_core import kernels as K
from gdn_core.cp_modes import CPSettings
from gdn_core.kernels import KernelUnavailable, ResolvedKernels, resolve_kernels

TORCH_V, JAX_V = metadata.version("torch"), metadata.version("jax")


def _resolve(framework, kernels="fused", *, device_kind="cpu", dtype="float32", head_dim=64,
             has_attention=True):
    return resolve_kernels(framework, kernels, device_kind=device_kind, dtype=dtype,
                           head_dim=head_dim, has_attention=has_attention)


@pytest.fixture
def fla(monkeypatch):
    """fla-core present (True) or absent (False) as the resolver sees it."""
    def set_installed(installed: bool) -> None:
        monkeypatch.setattr(K, "_fla_installed", lambda: installed)
    return set_installed


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("device_kind", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("has_attention", [True, False], ids=["hybrid", "gdn_only"])
def test_reference_is_our_code_everywhere(framework, device_kind, has_attention):
    """reference never depends on the device, dtype or packages: it is always servable."""
    got = _resolve(framework, "reference", device_kind=device_kind, dtype="float32",
                   head_dim=1024, has_attention=has_attention)
    assert got == ResolvedKernels(
        gdn=f"reference {framework} chunk rule",
        attention=({"torch": "reference torch blockwise tiles",
                    "jax": "reference jax blockwise"}[framework] if has_attention else None))


@pytest.mark.parametrize("device_kind,dtype,attention", [
    ("cpu", "float32", f"jax {JAX_V} dot_product_attention xla"),
    ("cpu", "bfloat16", f"jax {JAX_V} dot_product_attention xla"),
    ("gpu", "bfloat16", f"jax {JAX_V} dot_product_attention cudnn"),
    ("gpu", "float16", f"jax {JAX_V} dot_product_attention cudnn"),
    ("tpu", "float32", f"jax {JAX_V} splash attention"),
    ("tpu", "bfloat16", f"jax {JAX_V} splash attention"),
])
def test_jax_fused_attention_and_pallas_gdn_labelled(monkeypatch, device_kind, dtype,
                                                     attention):
    """The attention part alone (attention_kernel_name): on a CPU the whole point also needs
    the Pallas GDN rule, which runs there only interpreted (test_jax_pallas_kernels.py)."""
    monkeypatch.delenv(K.INTERPRET_ENV, raising=False)
    assert K.attention_kernel_name("jax", "fused", device_kind=device_kind, dtype=dtype,
                                   head_dim=128) == attention
    if device_kind == "cpu":
        with pytest.raises(KernelUnavailable, match="the Pallas chunk rule needs a TPU or GPU"):
            _resolve("jax", device_kind=device_kind, dtype=dtype, head_dim=128)
        return
    got = _resolve("jax", device_kind=device_kind, dtype=dtype, head_dim=128)
    assert got.attention == attention
    assert got.gdn == f"gdn_core pallas chunk rule ({device_kind})"
    assert got.gdn == K.jax_fused_gdn_name(device_kind)


def test_jax_fused_gdn_only_runs_on_any_chip():
    got = _resolve("jax", device_kind="gpu", dtype="float32", head_dim=None, has_attention=False)
    assert got == ResolvedKernels(gdn=K.jax_fused_gdn_name("gpu"), attention=None)


def test_jax_fused_cudnn_needs_half_precision():
    with pytest.raises(KernelUnavailable, match=r"cuDNN's dot_product_attention takes dtype "
                                                r"bfloat16 or float16, got dtype='float32'"):
        _resolve("jax", device_kind="gpu", dtype="float32")


@pytest.mark.parametrize("device_kind, head_dim, reason", [
    ("gpu", 12, r"cuDNN flash attention needs head_dim a multiple of 8 and <= 256, got "
                r"head_dim=12"),
    ("gpu", 512, r"<= 256, got head_dim=512"),
    ("tpu", 64, r"splash attention needs head_dim a multiple of 128 \(TPU lanes\), got "
                r"head_dim=64"),
])
def test_jax_fused_attention_head_limits_are_checked_before_a_trial_is_built(
        device_kind, head_dim, reason):
    with pytest.raises(KernelUnavailable, match=reason):
        _resolve("jax", device_kind=device_kind, dtype="bfloat16", head_dim=head_dim)


@pytest.mark.parametrize("device_kind", ["cpu", "tpu"])
@pytest.mark.parametrize("installed", [True, False])
def test_torch_fused_gdn_needs_a_cuda_device(fla, monkeypatch, device_kind, installed):
    """Without the interpreter switch; on a CPU the reason names it."""
    monkeypatch.delenv("GDN_SWEEP_INTERPRET_KERNELS", raising=False)
    fla(installed)
    with pytest.raises(KernelUnavailable) as err:
        _resolve("torch", device_kind=device_kind, has_attention=False)
    hint = (" (GDN_SWEEP_INTERPRET_KERNELS=1 runs it through Triton's interpreter on a CPU: a "
            "correctness check, not a speed)") if device_kind == "cpu" else ""
    assert str(err.value) == ("fla-core's chunk_gated_delta_rule needs a CUDA device (Triton); "
                              f"this trial runs on {device_kind}{hint}")


def test_torch_fused_gdn_needs_fla_core_on_gpu(fla):
    fla(False)
    with pytest.raises(KernelUnavailable, match=r"fla-core is not installed .*pip install "
                                                r"fla-core"):
        _resolve("torch", device_kind="gpu", dtype="bfloat16", has_attention=False)


def test_torch_fused_gdn_with_fla_on_gpu_is_fla_named_with_its_version(fla):
    """fla-core's kernel composed with the CP exchanges (torch_gdn.cp.kernel_rule): the name a
    result stores, with the installed version, never the reference under the fused name."""
    fla(True)
    got = _resolve("torch", device_kind="gpu", dtype="bfloat16", has_attention=False)
    assert got == ResolvedKernels(gdn=K.FLA_GDN.format(version=K._version("fla-core")),
                                  attention=None)


@pytest.mark.parametrize("changes,why", [
    (dict(gdn_chunk_size=128), r"takes chunk_size 16, 32, 64, got chunk_size=128"),
    (dict(gdn_head_k_dim=512), r"serves head_k_dim up to 256, got head_k_dim=512"),
    (dict(dtype="float64"), r"takes dtype float32, bfloat16, float16, got dtype='float64'"),
])
def test_torch_fused_gdn_limits_of_fla(fla, changes, why):
    fla(True)
    args = dict(device_kind="gpu", dtype="bfloat16", has_attention=False) | changes
    with pytest.raises(KernelUnavailable, match=rf"^fla-core .* chunk_gated_delta_rule {why}"):
        resolve_kernels("torch", "fused", head_dim=None, **args)


@pytest.mark.parametrize("dtype,head_dim,why", [
    ("float32", 128, r"SDPA's flash backend on gpu takes dtype bfloat16 or float16, got "
                     r"dtype='float32'"),
    ("bfloat16", 512, r"SDPA's flash backend serves head_dim up to 256, got head_dim=512"),
])
def test_torch_fused_attention_limits_on_gpu(fla, monkeypatch, dtype, head_dim, why):
    """fla serves the GDN rule here; attention's reason alone is given."""
    fla(True)
    with pytest.raises(KernelUnavailable, match=rf"^{why}"):
        _resolve("torch", device_kind="gpu", dtype=dtype, head_dim=head_dim)
    # attention alone, as the attention modules will ask it
    with pytest.raises(KernelUnavailable, match=why):
        K._torch_fused_attention(device_kind="gpu", dtype=dtype, head_dim=head_dim)


@pytest.mark.parametrize("device_kind,dtype,head_dim", [("cpu", "float32", 512),
                                                        ("gpu", "bfloat16", 256),
                                                        ("gpu", "float16", 64)])
def test_torch_fused_attention_name(device_kind, dtype, head_dim):
    assert (K._torch_fused_attention(device_kind=device_kind, dtype=dtype, head_dim=head_dim)
            == f"torch {TORCH_V} sdpa flash ({device_kind})")


def test_torch_on_tpu_has_no_attention_kernel():
    with pytest.raises(KernelUnavailable, match="torch has no TPU path"):
        K._torch_fused_attention(device_kind="tpu", dtype="bfloat16", head_dim=64)


@pytest.mark.parametrize("bad,match", [
    (dict(framework="mxnet"), r"framework='mxnet' is not one of: jax, torch"),
    (dict(kernels="bogus"), r"kernels='bogus' is not one of: reference, fused"),
    (dict(device_kind="npu"), r"device_kind='npu' is not one of: cpu, gpu, tpu"),
])
def test_bad_arguments_are_value_errors(bad, match):
    args = dict(framework="jax", kernels="reference", device_kind="cpu") | bad
    with pytest.raises(ValueError, match=match):
        _resolve(args.pop("framework"), args.pop("kernels"), **args)


def test_skip_reason_survives_pickling_and_cp_settings_carry_kernels():
    """The reason crosses Ray processes; CPSettings checks the value like its other fields."""
    err = pickle.loads(pickle.dumps(KernelUnavailable("why")))
    assert isinstance(err, KernelUnavailable) and str(err) == "why"
    assert CPSettings(mode="p2p", chips=2).kernels == "reference"
    assert CPSettings(mode="p2p", chips=2, kernels="fused").kernels == "fused"
    with pytest.raises(ValueError, match=r"kernels='bogus' is not one of: reference, fused"):
        CPSettings(mode="p2p", chips=2, kernels="bogus")


# ---------------------------------------------------------------- packed documents (issue 24)

@pytest.mark.parametrize("device_kind, kernel", [("gpu", "cuDNN"), ("tpu", "splash")])
def test_jax_fused_attention_without_a_mask_refuses_packed_documents(device_kind, kernel):
    with pytest.raises(KernelUnavailable, match=rf"{kernel} attention as bound here takes no "
                                                r"mask.*use documents: \[single\] or kernels: "
                                                r"\[reference\]"):
        resolve_kernels("jax", "fused", device_kind=device_kind, dtype="bfloat16",
                        head_dim=128, has_attention=True, packed_documents=True)
    resolve_kernels("jax", "fused", device_kind=device_kind, dtype="bfloat16", head_dim=128,
                    has_attention=True)  # one document per sequence: served


def test_packed_documents_are_served_where_the_kernels_take_boundaries(fla):
    fla(True)
    for framework in ("jax", "torch"):  # the references, GDN-only JAX, SDPA flash
        resolve_kernels(framework, "reference", device_kind="gpu", dtype="bfloat16",
                        head_dim=64, has_attention=True, packed_documents=True)
    for device_kind in ("gpu", "tpu"):  # the Pallas rule takes document starts
        resolve_kernels("jax", "fused", device_kind=device_kind, dtype="bfloat16",
                        head_dim=None, has_attention=False, packed_documents=True)
    # fla takes cu_seqlens, composed per segment (torch_gdn.cp.kernel_rule)
    got = resolve_kernels("torch", "fused", device_kind="gpu", dtype="bfloat16", head_dim=64,
                          has_attention=True, packed_documents=True)
    assert got.gdn == K.FLA_GDN.format(version=K._version("fla-core"))


# ------------------------------------------------- fla's own refusal on Hopper (fla issue #640)

HOPPER = dict(device_name="NVIDIA H200", capability=(9, 0), tilelang_installed=False)


@pytest.mark.parametrize("facts, refused", [
    (HOPPER | dict(triton_version="3.6.0"), True),  # the lent image
    (HOPPER | dict(triton_version="3.4.0"), True),
    (HOPPER | dict(triton_version="3.7.0+git1234"), True),
    (HOPPER | dict(triton_version="3.7.1"), False),
    (HOPPER | dict(triton_version="3.3.1"), False),
    (HOPPER | dict(triton_version="3.6.0", tilelang_installed=True), False),
    (dict(HOPPER, device_name="NVIDIA A100-SXM4-80GB", capability=(8, 0),
          triton_version="3.6.0"), False),
    (dict(HOPPER, device_name="NVIDIA H100 80GB HBM3", capability=None,
          triton_version="3.6.0"), True),  # named Hopper, as fla decides
    (dict(HOPPER, device_name="NVIDIA B200", capability=(10, 0), triton_version="3.6.0"), False),
], ids=["h200-3.6", "3.4.0", "3.7.0-dev", "3.7.1", "3.3.1", "tilelang", "a100", "h100-named",
        "b200"])
def test_fla_gated_backward_refusal_matches_fla(facts, refused):
    problem = K.fla_gated_backward_problem(**facts)
    assert (problem is not None) == refused, problem
    if refused:
        assert "#640" in problem and "Triton >= 3.7.1" in problem and "tilelang" in problem


def test_a_fused_torch_trial_on_hopper_with_triton_3_6_is_skipped_with_fla_reason(fla,
                                                                                 monkeypatch):
    """The rule book asks the worker's device and packages: on the lent image's H200 with
    Triton 3.6.0 a fused torch trial is skipped with fla's reason (not failed inside fla's
    backward); the reference trial is untouched."""
    fla(True)
    monkeypatch.setattr(K, "_cuda_device_facts",
                        lambda: HOPPER | dict(triton_version="3.6.0"))
    with pytest.raises(KernelUnavailable, match=r"^fla-core .* chunk_gated_delta_rule: its "
                                                r"gated backward .* Triton 3\.6\.0 on Hopper"):
        _resolve("torch", device_kind="gpu", dtype="bfloat16", has_attention=False)
    assert _resolve("torch", "reference", device_kind="gpu", dtype="bfloat16",
                    has_attention=False).gdn == K.REFERENCE_GDN["torch"]
    monkeypatch.setattr(K, "_cuda_device_facts",
                        lambda: HOPPER | dict(triton_version="3.7.1"))
    assert _resolve("torch", device_kind="gpu", dtype="bfloat16",
                    has_attention=False).gdn.startswith("fla-core ")
