"""Hand-written HLO text of a CP step's collectives, for the byte-splitting tests
(test_jax_comm_split.py, test_jax_dp_cp.py): the named scopes the step puts on its weight
traffic and its loss sum, and a module around the given collective lines."""

from __future__ import annotations

WEIGHTS = 'jit(shard_step)/shard_map/transpose(jvp())/weight_sync/psum'
LOSS = 'jit(shard_step)/shard_map/loss_sum/psum'


def hlo_program(*collectives: str, partitions: int) -> str:
    """An HLO module on `partitions` chips: parameters g f32[1024], l f32[], s f32[64] for the
    collective lines to use, and the %add reduction they may name."""
    body = "\n".join(f"  {line}" for line in collectives)
    return f"""HloModule jit_shard_step, num_partitions={partitions}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}}

ENTRY %main (g: f32[1024], l: f32[], s: f32[64]) -> f32[] {{
  %g = f32[1024]{{0}} parameter(0)
  %l = f32[] parameter(1)
  %s = f32[64]{{0}} parameter(2)
{body}
  ROOT %out = f32[] copy(%l)
}}
"""
