"""The gated delta rule as a Pallas kernel with the state in and out (issue 39).

Main entry point: `chunk_gated_delta_rule_pallas` (chunk_rule.py), fla's signature family
(q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv]; initial_state in, float32 final
state out), forward and backward Pallas kernels joined by a jax.custom_vjp. One kernel source,
two parameterisations (blocks.py): 'tpu' (Mosaic: a sequential grid over chunks, the state in
VMEM scratch) and 'gpu' (Triton: one program per (batch, head) looping over its chunks); on a
CPU it runs through Pallas's interpreter (interpret=True). The per-chunk math (chunk_math.py)
is what both kernel bodies trace; chunk_kernels.py builds the pallas_calls. Under context
parallelism it composes with every mode through cp/kernel_rule.py.
"""

from .blocks import BlockPlan, block_plan, check_tpu_tiling
from .chunk_rule import KERNEL_NAME, chunk_gated_delta_rule_pallas, resolve_platform

__all__ = ["BlockPlan", "KERNEL_NAME", "block_plan", "check_tpu_tiling",
           "chunk_gated_delta_rule_pallas", "resolve_platform"]
