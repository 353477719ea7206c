"""The closed set of context-parallel modes and the shape rules each one imposes.

Same names in both frameworks, the API, the database and the dashboard.
"""

from __future__ import annotations

from typing import Literal, get_args

CPMode = Literal["ulysses", "p2p", "all_gather", "log_scan"]
CP_MODES: tuple[str, ...] = get_args(CPMode)
SEQUENCE_SHARDED_MODES: tuple[str, ...] = ("p2p", "all_gather", "log_scan")


def check_mode(mode: str) -> None:
    if mode not in CP_MODES:
        raise ValueError(f"mode={mode!r} is not one of: {', '.join(CP_MODES)}")


def check_cp_shape(*, mode: str, chips: int, seq_len: int, num_k_heads: int, num_v_heads: int,
                   conv_kernel_size: int | None = None) -> None:
    """Raise ValueError naming the numbers when `mode` cannot split this shape over `chips`.

    seq_len is the global sequence; conv_kernel_size is given for layers (not for the bare
    rule), whose causal conv needs K−1 tokens of halo from the previous chip.
    """
    check_mode(mode)
    if not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips={chips!r} must be a positive integer")
    if seq_len % chips:
        raise ValueError(f"seq_len={seq_len} is not divisible by chips={chips}")
    if mode == "ulysses" and (num_k_heads % chips or num_v_heads % chips):
        raise ValueError(
            f"mode='ulysses' needs key heads ({num_k_heads}) and value heads ({num_v_heads}) "
            f"divisible by chips={chips}")
    halo = 0 if conv_kernel_size is None else conv_kernel_size - 1
    if chips > 1 and seq_len // chips < max(halo, 1):
        raise ValueError(
            f"local shard of {seq_len // chips} tokens (seq_len={seq_len} / chips={chips}) is "
            f"shorter than the conv halo of {halo} tokens (conv_kernel_size={conv_kernel_size})")
