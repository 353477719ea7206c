"""One compile per trial: CP bytes and the weights' traffic told apart in the step's own HLO
by the named scopes of their collectives (jax_gdn.cp.train.comm_bytes_per_chip), merged
collectives split by operand. The whole-step cases (every mode and sharding, exact bytes
against docs/architecture.md's table) are in test_jax_cp_train.py."""

from __future__ import annotations

import pytest

from gdn_core.jax_gdn.cp.train import comm_bytes_per_chip

from .hlo_programs import LOSS, WEIGHTS, hlo_program

EXCHANGE = 'jit(shard_step)/shard_map/jvp()/ppermute'


def program(*collectives: str) -> str:
    return hlo_program(*collectives, partitions=2)


def test_a_merged_all_reduce_is_split_by_operand_along_its_source_paths():
    # XLA's all-reduce combiner folded the loss sum into the gradient all-reduce and joined
    # their source paths with ":" in operand order.
    text = program(
        f'%ar = (f32[1024]{{0}}, f32[]) all-reduce(%g, %l), replica_groups={{{{0,1}}}}, '
        f'to_apply=%add, metadata={{op_name="{WEIGHTS}:{LOSS}"}}',
        f'%cp = f32[64]{{0}} collective-permute(%s), source_target_pairs={{{{0,1}}}}, '
        f'metadata={{op_name="{EXCHANGE}"}}')
    cp, weights = comm_bytes_per_chip(text, 2)
    assert weights == 2 * (2 - 1) * 4096 // 2  # the gradients' ring all-reduce alone
    assert cp == 256 + 2 * (2 - 1) * 4 // 2  # the exchange to chip 1 and the loss sum


def test_a_merged_collective_whose_paths_do_not_match_its_operands_is_an_error():
    text = program(
        f'%ar = (f32[1024]{{0}}, f32[], f32[64]{{0}}) all-reduce(%g, %l, %s), '
        f'replica_groups={{{{0,1}}}}, to_apply=%add, metadata={{op_name="{WEIGHTS}:{LOSS}"}}')
    with pytest.raises(RuntimeError, match="cannot separate CP bytes"):
        comm_bytes_per_chip(text, 2)


def test_collectives_without_this_codes_scopes_are_refused_not_guessed():
    # What a persistent-cache entry compiled from other source looks like: its metadata
    # predates the scopes, so every byte would silently count as CP traffic.
    text = program(
        f'%ar = (f32[1024]{{0}}, f32[]) all-reduce(%g, %l), replica_groups={{{{0,1}}}}, '
        f'to_apply=%add, metadata={{op_name="jit(shard_step)/shard_map/psum"}}')
    with pytest.raises(RuntimeError, match="JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY"):
        comm_bytes_per_chip(text, 2)
