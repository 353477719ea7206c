"""Synthetic token data with learnable structure, identical for every framework and CP layout."""

from __future__ import annotations

import numpy as np


def synthetic_tokens(*, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0,
                     noise: float = 0.1) -> np.ndarray:
    """Token ids [batch_size, seq_len + 1] (int32) from a fixed random successor table.

    Each next token is `successor[token]` with probability 1 − noise, else uniform: a model
    that learns the table drives the loss towards the noise floor, so loss must fall.
    Inputs are [:, :-1] and targets [:, 1:]; a CP rank takes its contiguous slice of both.
    """
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab_size)
    tokens = np.empty((batch_size, seq_len + 1), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, vocab_size, batch_size)
    random_tokens = rng.integers(0, vocab_size, (batch_size, seq_len))
    use_random = rng.random((batch_size, seq_len)) < noise
    for t in range(seq_len):
        tokens[:, t + 1] = np.where(use_random[:, t], random_tokens[:, t], successor[tokens[:, t]])
    return tokens.astype(np.int32)
