"""Argument checks shared by every gated-delta-rule entry point (framework-agnostic)."""

from __future__ import annotations

from .config import SUPPORTED_CHUNK_SIZES

# Legend for shape-suffixed names across gdn_core:
#   B batch, T tokens, N chunks, C chunk length, H value heads (Hv), G key heads (Hk),
#   K key head dim (Dk), V value head dim (Dv).


def check_rule_args(q_shape, k_shape, v_shape, g_shape, beta_shape, state_shape, chunk_size):
    """Validate the rule's shapes; return (B, T, Hk, Hv, Dk, Dv). Raise ValueError naming values."""
    if len(q_shape) != 4 or tuple(q_shape) != tuple(k_shape):
        raise ValueError(f"q {tuple(q_shape)} and k {tuple(k_shape)} must both be [B, T, Hk, Dk]")
    B, T, Hk, Dk = q_shape
    if len(v_shape) != 4 or tuple(v_shape[:2]) != (B, T):
        raise ValueError(f"v {tuple(v_shape)} must be [B={B}, T={T}, Hv, Dv]")
    Hv, Dv = v_shape[2], v_shape[3]
    if Hv % Hk:
        raise ValueError(f"value heads Hv={Hv} must be a multiple of key heads Hk={Hk}")
    for name, shape in (("g", g_shape), ("beta", beta_shape)):
        if tuple(shape) != (B, T, Hv):
            raise ValueError(f"{name} {tuple(shape)} must be [B, T, Hv] = {(B, T, Hv)}")
    if state_shape is not None and tuple(state_shape) != (B, Hv, Dk, Dv):
        raise ValueError(
            f"initial_state {tuple(state_shape)} must be [B, Hv, Dk, Dv] = {(B, Hv, Dk, Dv)}")
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not one of {SUPPORTED_CHUNK_SIZES}")
    return B, T, Hk, Hv, Dk, Dv
