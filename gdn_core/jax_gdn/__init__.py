"""JAX Gated DeltaNet: the chunked rule, its token-by-token reference, layer, model, CP.

Main entry points: `chunk_gated_delta_rule` (one chip) and, for context parallelism over a
mesh axis, `chunk_gated_delta_rule_cp`; `gdn_layer`, `model_forward` / `model_loss` (layers
under lax.scan, chunked cross-entropy, remat policies) and `make_train_step` / `run_training`
for the layer, the language model and its training step (parameters are nested dicts in
PyTorch state_dict layout with the decoder layers stacked, see params.py), and under CP
`gdn_layer_cp`, `make_cp_train_step` / `run_cp_training` (weights replicated, zero1 or fsdp
over the CP chips, cp/param_sharding.py). Attention under CP merges segment pairs
(attention_pairs.py) computed by the reference tiles or a library kernel (attention_fused.py);
kernels.py resolves the `kernels` setting to them, named with versions.
"""

from .chunk import chunk_gated_delta_rule
from .cp import (
    chunk_gated_delta_rule_cp,
    gdn_layer_cp,
    make_cp_train_step,
    run_cp_training,
)
from .layer import gdn_layer
from .model import chunked_token_loss_sum, model_forward, model_loss, token_loss_sum
from .naive import recurrent_gated_delta_rule
from .params import from_state_dict, init_layer_params, init_model_params, to_state_dict
from .train import make_train_step, run_training

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_cp",
    "chunked_token_loss_sum",
    "from_state_dict",
    "gdn_layer",
    "gdn_layer_cp",
    "init_layer_params",
    "init_model_params",
    "make_cp_train_step",
    "make_train_step",
    "model_forward",
    "model_loss",
    "recurrent_gated_delta_rule",
    "run_cp_training",
    "run_training",
    "to_state_dict",
    "token_loss_sum",
]
