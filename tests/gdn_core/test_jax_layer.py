"""JAX GDN layer vs the PyTorch layer (same weights), conv halo, state_dict round trip, bf16.

Legend: B batch, T tokens, D hidden, C conv channels.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from gdn_core.jax_gdn import recurrent_gated_delta_rule
from gdn_core.jax_gdn.layer import causal_conv, conv_halo, gdn_layer
from gdn_core.jax_gdn.params import from_state_dict, to_state_dict
from gdn_core.presets import get_preset
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn.layer import GatedDeltaNet, causal_conv1d

CFG = get_preset("tiny").gdn
B, T = 2, 40  # T not a multiple of the chunk (16): the padded last chunk is exercised
BF16_TOL = 3e-2  # bf16 layer vs fp32 layer; measured ~1e-2 (bf16 has an 8-bit mantissa)


def torch_layer(seed=0):
    torch.manual_seed(seed)
    return GatedDeltaNet(CFG)  # torch's default (kaiming-uniform) weights: larger than 0.02


def inputs(seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, CFG.hidden_size, generator=gen)
    cotangent = torch.randn(B, T, CFG.hidden_size, generator=gen)
    return x, cotangent


@jax.jit
def _value_and_grads(params, x_BTD, r_BTD):
    def objective(params, x_BTD):
        return jnp.sum(gdn_layer(params, x_BTD, CFG) * r_BTD)

    y_BTD = gdn_layer(params, x_BTD, CFG)
    return y_BTD, jax.grad(objective, argnums=(0, 1))(params, x_BTD)


@pytest.mark.timeout(120)
def test_layer_matches_torch_forward_and_grads():
    module = torch_layer()
    x, r = inputs()
    x.requires_grad_(True)
    y_ref = module(x)
    y_ref.backward(r)

    params = from_state_dict(module.state_dict())
    y, (grad_params, grad_x) = _value_and_grads(params, jnp.asarray(x.detach().numpy()),
                                                jnp.asarray(r.numpy()))
    assert y.dtype == jnp.float32
    assert_close("o", y_ref, y, 1e-5)
    assert_close("dx", x.grad, grad_x, 1e-4)
    grads = to_state_dict(grad_params)
    torch_grads = {name: p.grad for name, p in module.named_parameters()}
    assert grads.keys() == torch_grads.keys()
    for name, ref in torch_grads.items():
        assert_close(f"d{name}", ref, grads[name], 1e-4)
    print(f"layer vs torch: o {rel_err(y_ref.detach(), y):.1e}, dx {rel_err(x.grad, grad_x):.1e}, "
          f"worst param grad {max(rel_err(g, grads[n]) for n, g in torch_grads.items()):.1e}")


@pytest.mark.timeout(60)
def test_state_dict_round_trip_is_exact():
    state_dict = torch_layer(seed=3).state_dict()
    params = from_state_dict(state_dict)
    assert params["conv1d"]["weight"].shape == (CFG.conv_dim, 1, CFG.conv_kernel_size)
    back = to_state_dict(params)
    assert back.keys() == state_dict.keys()
    for name, value in state_dict.items():
        assert back[name].dtype == np.float32
        np.testing.assert_array_equal(back[name], value.numpy(), err_msg=name)
    # A top-level "layers" list is stacked for lax.scan (one block position here) and unstacks.
    nested = from_state_dict({"layers.1.w": np.ones(2), "layers.0.w": np.zeros(2)})
    assert nested["block"][0]["w"].shape == (2, 2) and float(nested["block"][0]["w"][1, 0]) == 1.0
    assert sorted(to_state_dict(nested)) == ["layers.0.w", "layers.1.w"]
    with pytest.raises(ValueError, match="0..1"):
        from_state_dict({"layers.0.w": np.ones(1), "layers.2.w": np.ones(1)})


@pytest.mark.timeout(60)
def test_conv_with_halo_equals_whole_sequence():
    K = CFG.conv_kernel_size
    rng = np.random.default_rng(0)
    weight = jnp.asarray(rng.standard_normal((CFG.conv_dim, 1, K)), jnp.float32)
    mixed_BTC = jnp.asarray(rng.standard_normal((B, T, CFG.conv_dim)), jnp.float32)
    whole = causal_conv(weight, mixed_BTC)
    cut = 17
    first = causal_conv(weight, mixed_BTC[:, :cut])
    second = causal_conv(weight, mixed_BTC[:, cut:], conv_halo(mixed_BTC[:, :cut], K))
    assert_close("split conv", whole, jnp.concatenate([first, second], axis=1), 1e-6)
    # Without the halo the second part's first K−1 tokens differ (the halo really matters).
    assert rel_err(whole[:, cut:], causal_conv(weight, mixed_BTC[:, cut:])) > 1e-2
    # And the torch twin's conv agrees on the halo convention.
    ref = causal_conv1d(torch.tensor(np.asarray(mixed_BTC[:, cut:])),
                        torch.tensor(np.asarray(weight[:, 0, :])),
                        torch.tensor(np.asarray(mixed_BTC[:, cut - K + 1:cut])))
    assert_close("torch conv with halo", ref, second, 1e-6)
    with pytest.raises(ValueError, match="K-1"):
        causal_conv(weight, mixed_BTC, mixed_BTC[:, :K])


@pytest.mark.timeout(120)
def test_rule_and_halo_hooks():
    params = from_state_dict(torch_layer().state_dict())
    x_BTD = jnp.asarray(inputs()[0].numpy())

    def naive_rule(q, k, v, g, beta, *, use_qk_l2norm, chunk_size):
        del chunk_size  # the token-by-token rule has no chunks
        return recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm)

    @jax.jit
    def run(params, x_BTD):
        zeros = gdn_layer(params, x_BTD, CFG, halo_fn=lambda m: jnp.zeros_like(m[:, :3]))
        return gdn_layer(params, x_BTD, CFG), gdn_layer(params, x_BTD, CFG, rule=naive_rule), \
            zeros

    y, y_naive, y_zero_halo = run(params, x_BTD)
    assert_close("naive rule in layer", y_naive, y, 1e-5)
    np.testing.assert_array_equal(np.asarray(y_zero_halo), np.asarray(y))


@pytest.mark.timeout(120)
def test_bf16_layer_close_to_fp32_and_torch_bf16():
    module = torch_layer()
    params = from_state_dict(module.state_dict())
    x = inputs()[0]
    x_BTD = jnp.asarray(x.numpy())
    run = jax.jit(gdn_layer, static_argnames=("cfg", "dtype"))
    y32 = run(params, x_BTD, cfg=CFG, dtype=jnp.float32)
    y16 = run(params, x_BTD, cfg=CFG, dtype=jnp.bfloat16)
    assert y16.dtype == jnp.bfloat16
    err = rel_err(y32, y16)
    with torch.no_grad():
        y16_torch = module.to(torch.bfloat16)(x.to(torch.bfloat16))
    err_torch = rel_err(y16_torch, y16)
    print(f"bf16 layer: vs fp32 rel {err:.3e}, vs torch bf16 rel {err_torch:.3e}")
    assert 0 < err <= BF16_TOL
    assert err_torch <= BF16_TOL
