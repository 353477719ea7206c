"""The JAX rule, layer, model and training step on the GPU against the same on the CPU.

One process holds both backends (scripts/device-check.sh sets JAX_PLATFORMS='': every
backend present; the suite's default, cpu, leaves these tests skipped), and every computation
is placed with jax.default_device or on committed arrays. Inputs and tolerances follow
test_gpu_torch.py: float32 on the GPU must match float32 on the CPU to float32 round-off (our
float32 matmuls run at Precision.HIGHEST, so no TF32), and bfloat16 on the GPU is compared
with float32 on the CPU on the same inputs within what bf16 on the CPU meets (×2, noted at
each tolerance).
Legend: B batch, T tokens.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest

from gdn_core import jax_gdn
from gdn_core.data import synthetic_tokens
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import from_state_dict, init_model_params, to_state_dict
from gdn_core.jax_gdn.train import run_training
from gdn_core.presets import get_preset
from gdn_core.testing import assert_close, max_verify_error
from gdn_core.train_config import TrainConfig

from .test_correlated_keys import (BF16_STATE_TOL, BF16_TOL, CI_CASES, FP32_TOL, LAYER_CFG,
                                   assert_all_close, bf16_rounded, correlated_key_layer, inputs,
                                   jax_run, reference)

pytestmark = pytest.mark.gpu

CASE, L2NORM = CI_CASES[0]  # T=200, Hk=2, Hv=4, Dk=32, Dv=16, C=64, cosine 0.97, l2norm on
DTYPES = ("float32", "bfloat16")
FP32_GRAD_TOL = 1e-4  # layer/model gradients, gpu vs cpu (verify's floor); fp32 round-off
FP32_LOSS_TOL = 1e-5
FP32_UPDATED_LOSS_TOL = 1e-4  # the loss after one AdamW step (≈ lr·sign(grad) per weight)
BF16_LAYER_TOL = 5e-2  # y and dx; bf16 vs fp32 on CPU measured 2.0e-2, 2.3e-2
BF16_LAYER_GRAD_TOL = 0.2  # weight gradients (verify's floor); on CPU measured 8.5e-2
#                            (in_proj_b, whose gradient is 0.4% of the layer's)
BF16_LOSS_TOL = 1e-3  # model loss and step losses; on CPU measured 5.7e-5, 2.7e-4
BF16_MODEL_GRAD_TOL = 6e-2  # model gradients (verify's floor); on CPU measured 2.7e-2
MODEL = get_preset("tiny")  # 2 layers, hidden 64, chunk 16
B, T = 2, 64


@pytest.fixture(scope="module")
def gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError as err:
        pytest.skip(f"JAX sees no GPU ({err}); JAX_PLATFORMS="
                    f"{os.environ.get('JAX_PLATFORMS')!r} (tests/conftest.py defaults it to cpu; "
                    "scripts/device-check.sh sets '', every backend present)")


@pytest.fixture(scope="module")
def cpu():
    return jax.devices("cpu")[0]


def on(device, tree):
    return jax.device_put(tree, device)


def placed_on(device, tree) -> bool:
    return all(leaf.devices() == {device} for leaf in jax.tree.leaves(tree))


@functools.cache
def cpu_rule(rounded: bool):
    x = bf16_rounded(inputs(CASE)) if rounded else inputs(CASE)
    with jax.default_device(jax.devices("cpu")[0]):
        return jax_run(x, jax_gdn.chunk_gated_delta_rule, use_qk_l2norm=L2NORM,
                       chunk_size=CASE.chunk_size)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rule_on_gpu_matches_cpu(gpu, dtype):
    rounded = dtype == "bfloat16"
    x = bf16_rounded(inputs(CASE)) if rounded else inputs(CASE)
    with jax.default_device(gpu):
        got = jax_run(x, jax_gdn.chunk_gated_delta_rule, dtype=jnp.dtype(dtype),
                      use_qk_l2norm=L2NORM, chunk_size=CASE.chunk_size)
    assert placed_on(gpu, got)
    assert got["o"].dtype == jnp.dtype(dtype) and got["final_state"].dtype == jnp.float32
    if dtype == "float32":
        assert_all_close(reference(CASE, L2NORM), got, FP32_TOL, label="gpu vs float64 ")
        assert_all_close(cpu_rule(False), got, FP32_TOL, label="gpu vs cpu ")
    else:
        assert_all_close(cpu_rule(True), got, BF16_TOL, BF16_STATE_TOL,
                         label="gpu bf16 vs cpu fp32 ")


@functools.partial(jax.jit, static_argnames="dtype")
def layer_vjp(params, x_BTD, cotangent_BTD, dtype):
    """(y, dx, weight gradients) of the GDN layer in `dtype` (weights cast from float32)."""
    y, vjp = jax.vjp(lambda p, x: gdn_layer(p, x, LAYER_CFG, dtype=dtype), params, x_BTD)
    grads, dx = vjp(cotangent_BTD.astype(y.dtype))
    return y, dx, grads


def layer_run(device, dtype):
    module, x, cotangent = correlated_key_layer()
    params = on(device, from_state_dict(module.state_dict()))
    y, dx, grads = layer_vjp(params, on(device, x.numpy()), on(device, cotangent.numpy()),
                             jnp.dtype(dtype))
    assert placed_on(device, (y, dx, grads))
    by_name = to_state_dict(grads)
    return y, dx, [by_name[n] for n in sorted(by_name)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_on_gpu_matches_cpu(gpu, cpu, dtype):
    y_ref, dx_ref, grads_ref = layer_run(cpu, "float32")
    y, dx, grads = layer_run(gpu, dtype)
    assert y.dtype == jnp.dtype(dtype)
    tol, grad_tol = ((FP32_TOL, FP32_GRAD_TOL) if dtype == "float32"
                     else (BF16_LAYER_TOL, BF16_LAYER_GRAD_TOL))
    assert_close(f"y ({dtype})", y_ref, y, tol)
    assert_close(f"dx ({dtype})", dx_ref, dx, tol if dtype == "bfloat16" else FP32_GRAD_TOL)
    err = max_verify_error(y_ref, y, grads_ref, grads)
    assert err <= grad_tol, f"weight gradients ({dtype}): {err:.3e} > {grad_tol:.1e}"


@functools.partial(jax.jit, static_argnames="dtype")
def model_value_and_grad(params, inputs_BT, targets_BT, dtype):
    return jax.value_and_grad(model_loss)(params, inputs_BT, targets_BT, MODEL,
                                          global_tokens=B * T, dtype=dtype)


def model_run(device, dtype):
    """(mean loss, gradient leaves) of the tiny model, key 6, on one batch, on `device`."""
    tokens = synthetic_tokens(batch_size=B, seq_len=T, vocab_size=MODEL.vocab_size, seed=7)
    params = on(device, init_model_params(MODEL, jax.random.PRNGKey(6)))
    loss, grads = model_value_and_grad(params, on(device, tokens[:, :-1]),
                                       on(device, tokens[:, 1:]), jnp.dtype(dtype))
    assert placed_on(device, (loss, grads))
    return loss, jax.tree.leaves(grads)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_on_gpu_matches_cpu(gpu, cpu, dtype):
    loss_ref, grads_ref = model_run(cpu, "float32")
    loss, grads = model_run(gpu, dtype)
    assert all(g.dtype == jnp.float32 for g in grads)  # float32 masters' gradients
    loss_tol, grad_tol = ((FP32_LOSS_TOL, FP32_GRAD_TOL) if dtype == "float32"
                          else (BF16_LOSS_TOL, BF16_MODEL_GRAD_TOL))
    assert_close(f"loss ({dtype})", loss_ref, loss, loss_tol)
    err = max_verify_error(loss_ref, loss, grads_ref, grads)
    assert err <= grad_tol, f"model gradients ({dtype}): {err:.3e} > {grad_tol:.1e}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("dtype", DTYPES)
def test_training_step_on_gpu_matches_cpu(gpu, cpu, dtype):
    # Two steps, no warm-up: the first loss is the initial model's, the second follows one
    # AdamW update (≈ lr·sign(grad) at step 1, so it shows a wrong gradient's sign).
    def run(device, dtype):
        with jax.default_device(device):
            return run_training(MODEL, TrainConfig(batch_size=B, seq_len=T, dtype=dtype),
                                steps=2, warmup_steps=0)

    ref, got = run(cpu, "float32"), run(gpu, dtype)
    assert got.losses[1] < got.losses[0]  # the update was applied
    tols = ((FP32_LOSS_TOL, FP32_UPDATED_LOSS_TOL) if dtype == "float32"
            else (BF16_LOSS_TOL, BF16_LOSS_TOL))
    for step, (a, b, tol) in enumerate(zip(ref.losses, got.losses, tols)):
        assert_close(f"loss at step {step} ({dtype})", a, b, tol)
