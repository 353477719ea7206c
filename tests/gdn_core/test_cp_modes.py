"""The CP mode set's shape rules (gdn_core.cp_modes): check_cp_shape, the ulysses head plan,
and CPSettings, the one config a CP training step takes."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gdn_core.cp_modes import (
    CP_MODES,
    NO_CP,
    ONE_CHIP_ATTN_CP,
    ONE_CHIP_CP_MODE,
    CPSettings,
    UlyssesHeads,
    check_cp_shape,
    cp_settings_for_trial,
    gdn_mode,
    trial_mode,
)
from gdn_core.presets import get_preset

# (Hk, Hv) × D with Hv % D == 0: D divides Hk, Hk divides D (copies), and neither.
HEAD_GRID = [(Hk, Hv, D) for Hk, r, D in itertools.product((1, 2, 3, 4, 16), (1, 2, 3, 4),
                                                           (1, 2, 3, 4, 8, 16, 32, 64))
             if (Hv := Hk * r) % D == 0]


@pytest.mark.parametrize("Hk,Hv,D", HEAD_GRID, ids=lambda x: str(x))
def test_ulysses_heads_serve_every_value_head(Hk, Hv, D):
    """Chip j's local value head i finds key head i // (Hl/G) of its G = key_heads(j), and that
    is the head the single-chip rule pairs with it (value head h uses key head h // (Hv/Hk))."""
    plan = UlyssesHeads(num_k_heads=Hk, num_v_heads=Hv, chips=D)
    G, Hl = plan.key_heads_per_chip, plan.value_heads_per_chip
    assert Hl * D == Hv and Hl % G == 0
    for chip in range(D):
        keys = plan.key_heads(chip)
        assert len(keys) == G
        for i, h in enumerate(plan.value_heads(chip)):
            assert keys[i // (Hl // G)] == h // (Hv // Hk), (chip, i, keys)
    assert plan.send_key_heads == sum((plan.key_heads(j) for j in range(D)), ())
    # No copies where the key heads split evenly; every key head is sent at least once.
    assert len(plan.send_key_heads) == (Hk if Hk % D == 0 else D if D % Hk == 0 else Hv)
    assert set(plan.send_key_heads) == set(range(Hk))


def test_ulysses_heads_of_the_qwen35_presets():
    """16 key heads, 32 value heads: 32 chips get one key head each, each sent to 2 chips."""
    plan = UlyssesHeads(num_k_heads=16, num_v_heads=32, chips=32)
    assert plan.key_heads_per_chip == 1 and plan.key_heads(5) == (2,)
    assert plan.send_key_heads == tuple(h // 2 for h in range(32))
    assert UlyssesHeads(num_k_heads=16, num_v_heads=32, chips=8).key_heads(1) == (2, 3)


def test_check_cp_shape_ulysses_needs_only_value_heads_divisible():
    check_cp_shape(mode="ulysses", chips=64, seq_len=64 * 8, num_k_heads=16, num_v_heads=64)
    with pytest.raises(ValueError, match=r"mode='ulysses' needs value heads \(48\) divisible by "
                                         r"chips=32; chips must be one of 1, 2, 3, 4, 6, 8, 12, "
                                         r"16, 24, 48"):
        check_cp_shape(mode="ulysses", chips=32, seq_len=32 * 8, num_k_heads=16,
                       num_v_heads=48)
    with pytest.raises(ValueError, match=r"value heads \(6\) divisible by chips=4"):
        UlyssesHeads(num_k_heads=3, num_v_heads=6, chips=4)
    with pytest.raises(ValueError, match=r"num_v_heads=6 must be a multiple of num_k_heads=4"):
        UlyssesHeads(num_k_heads=4, num_v_heads=6, chips=2)


def test_cp_settings_defaults_and_frozen():
    cp = CPSettings(mode="p2p", chips=4)
    assert (cp.attn_cp, cp.layout) == ("all_gather_kv", "contiguous")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.mode = "ulysses"
    with pytest.raises(TypeError):
        CPSettings("p2p", 4)  # keyword-only: no positional mix-ups of mode and attn_cp


@pytest.mark.parametrize("field,value,accepted", [
    ("mode", "ring", "ulysses, p2p, all_gather, log_scan"),
    ("mode", "none", "ulysses, p2p, all_gather, log_scan"),  # a trial's name, not gdn_core's
    ("attn_cp", "p2p", "all_gather_kv, ring, ulysses"),
    ("attn_cp", None, "all_gather_kv, ring, ulysses"),
    ("layout", "spiral", "contiguous, zigzag"),
    ("chips", 0, "integer >= 1"),
    ("chips", True, "integer >= 1"),
    ("chips", "2", "integer >= 1"),
], ids=lambda x: repr(x))
def test_cp_settings_refuse_bad_values_naming_them(field, value, accepted):
    with pytest.raises(ValueError) as caught:
        CPSettings(**{"mode": "p2p", "chips": 2, field: value})
    assert f"{field}={value!r}" in str(caught.value) and accepted in str(caught.value)


def test_the_one_chip_names_and_their_inverse():
    """A trial's mode "none" runs as ONE_CHIP_CP_MODE and a step on one chip per replica is
    named "none" again; every CP mode on more chips keeps its name both ways."""
    assert gdn_mode(NO_CP) == ONE_CHIP_CP_MODE
    assert CPSettings.one_chip(kernels="fused") == CPSettings(
        mode=ONE_CHIP_CP_MODE, chips=1, attn_cp=ONE_CHIP_ATTN_CP, kernels="fused")
    for mode in CP_MODES:
        assert gdn_mode(mode) == mode and trial_mode(mode, cp_chips=2) == mode
        assert trial_mode(mode, cp_chips=1) == NO_CP
    for chips, dp in ((1, 1), (4, 4), (4, 2)):
        cp = cp_settings_for_trial(mode=NO_CP if chips == dp else "log_scan", attn_cp=None,
                                   layout="contiguous", chips=chips, dp=dp)
        assert trial_mode(cp.mode, cp_chips=cp.cp_chips) == (NO_CP if chips == dp
                                                              else "log_scan")


@pytest.mark.parametrize("cp, seq_len, needle", [
    (CPSettings(mode="p2p", chips=4, layout="zigzag"), 16,
     "zigzag segment of 2 tokens (seq_len=16 / (2 × chips=4)) is shorter than the "
     "conv halo of 3 tokens"),
    (CPSettings(mode="p2p", chips=4, layout="zigzag"), 100,
     "seq_len=100 is not divisible by 8 (2 × chips=4)"),
    (CPSettings(mode="p2p", chips=8, attn_cp="ulysses"), 256,
     "attn_cp='ulysses' needs query heads (4) divisible by chips=8"),
    (CPSettings(mode="p2p", chips=8, dp=2, layout="zigzag"), 8,
     "each of dp=2 replicas splits the sequence over cp_chips=4 = chips=8 / dp=2"),
], ids=["zigzag-segment-under-halo", "zigzag-indivisible", "ulysses-attention", "dp"])
def test_one_shape_check_for_the_step(cp, seq_len, needle):
    """CPSettings.check_shape: the GDN rules (check_cp_shape, zigzag's halo per segment) and a
    hybrid's attention rules, over one replica's cp_chips; ulysses GDN layers move heads, not
    halos, so zigzag segments shorter than the halo are theirs to take."""
    hybrid = get_preset("tiny", layers="hybrid", num_layers=2)
    with pytest.raises(ValueError) as error:
        cp.check_shape(hybrid, seq_len)
    assert needle in str(error.value)
    CPSettings(mode="ulysses", chips=4, layout="zigzag").check_shape(
        get_preset("tiny", num_layers=1), 16)
