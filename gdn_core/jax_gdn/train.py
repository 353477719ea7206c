"""JAX training step for the GDN language model: AdamW on float32 master weights.

With dtype "bfloat16" each layer's weights are cast to bf16 where they are used (activations
follow), matmuls run bf16 × bf16 accumulating in float32, the gradients come back float32
through the cast, and the rule keeps its state in float32. train_cfg.remat picks the decoder
layers' jax.checkpoint policy (model.remat_policy). On one chip param_sharding has nothing to
shard: every setting runs the replicated step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import device_memory
from ..config import ModelConfig
from ..data import synthetic_tokens
from ..packing import document_boundaries
from ..train_config import TrainConfig, TrainReport
from .model import (
    LOSS_CHUNK_TOKENS,
    AttendFn,
    Fetch,
    GDNLayerFn,
    cast_fetch,
    model_loss,
)
from .params import Params, init_model_params

GradTransform = Callable[[Params], Params]
ApplyUpdate = Callable[[Params, optax.OptState, Params], tuple[Params, optax.OptState]]
"""(grads, opt_state, params) -> (new params, new opt_state)."""
StepFn = Callable[..., tuple[Params, optax.OptState, jax.Array]]

ESTIMATE_SOURCE = "xla_memory_analysis"
"""TrainReport.estimated_memory_source of compiled_peak_bytes."""
MEMORY_SOURCE = ESTIMATE_SOURCE  # the name gdn_core.bench.step imports


def packed_boundaries(train_cfg: TrainConfig) -> np.ndarray | None:
    """cu_seqlens of train_cfg.documents (packing.document_boundaries), None for 'single'. A
    verify's prefix (train_cfg.seq_len cut short) gets the first documents of the full
    sequence, the last one cut where the prefix ends."""
    return document_boundaries(train_cfg.documents, seq_len=train_cfg.seq_len,
                               seed=train_cfg.seed)


def make_optimizer(train_cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW with the config's learning rate and decoupled weight decay."""
    return optax.adamw(learning_rate=train_cfg.learning_rate,
                       weight_decay=train_cfg.weight_decay)


def adamw_update(optimizer: optax.GradientTransformation) -> ApplyUpdate:
    """The plain update: optimizer.update on whole (or, FSDP, equally sharded) trees."""
    def apply(grads, opt_state, params):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return apply


def build_step_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, global_tokens: int,
                  grad_transform: GradTransform | None = None,
                  gdn_layer_fn: GDNLayerFn | None = None, fetch: Fetch = cast_fetch,
                  apply_update: ApplyUpdate | None = None,
                  loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
                  attend_fn: AttendFn | None = None,
                  positions_fn: Callable[[], jax.Array] | None = None) -> StepFn:
    """Return the un-jitted step; see make_train_step for its signature.

    Un-jitted so CP can wrap it in shard_map before jit. grad_transform runs on the float32
    gradients before the update (CP: sum over shards); the returned loss is this shard's
    loss_sum / global_tokens (single chip: the mean loss). fetch and apply_update are the
    hooks a sharded step replaces (model.Fetch; default: cast, and AdamW on whole trees);
    attend_fn and positions_fn (called inside the step: this shard's token positions) are the
    attention layers' hooks (model.hidden_states). Every row is packed as train_cfg.documents
    says (packing.document_boundaries over the global train_cfg.seq_len: a constant of the
    program, the same on every chip).
    """
    dtype = jnp.dtype(train_cfg.dtype)
    cu_seqlens = packed_boundaries(train_cfg)
    apply_update = adamw_update(make_optimizer(train_cfg)) if apply_update is None \
        else apply_update

    def loss_fn(params, inputs_BT, targets_BT):
        return model_loss(params, inputs_BT, targets_BT, model_cfg, global_tokens=global_tokens,
                          dtype=dtype, gdn_layer_fn=gdn_layer_fn, fetch=fetch,
                          remat=train_cfg.remat, loss_chunk_tokens=loss_chunk_tokens,
                          attend_fn=attend_fn, cu_seqlens=cu_seqlens,
                          positions=None if positions_fn is None else positions_fn())

    def step(params, opt_state, inputs_BT, targets_BT):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs_BT, targets_BT)
        if grad_transform is not None:
            grads = grad_transform(grads)
        params, opt_state = apply_update(grads, opt_state, params)
        return params, opt_state, loss

    return step


def make_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, global_tokens: int,
                    grad_transform: GradTransform | None = None,
                    gdn_layer_fn: GDNLayerFn | None = None,
                    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS) -> StepFn:
    """Jitted step(params, opt_state, inputs_BT, targets_BT) -> (params, opt_state, loss).

    params and opt_state are donated (do not reuse the passed-in ones); loss is float32.
    """
    step = build_step_fn(model_cfg, train_cfg, global_tokens=global_tokens,
                         grad_transform=grad_transform, gdn_layer_fn=gdn_layer_fn,
                         loss_chunk_tokens=loss_chunk_tokens)
    return jax.jit(step, donate_argnums=(0, 1))


def compiled_peak_bytes(compiled) -> int | None:
    """Peak bytes of a compiled step from XLA: arguments + outputs + temporaries − aliased.

    Donated params/opt_state alias their outputs, so the aliased bytes are counted once.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
               + stats.temp_size_in_bytes - stats.alias_size_in_bytes)


class TimedSteps(NamedTuple):
    """What run_timed_steps ran: every loss, the measured steps' times, and the state after the
    last step (params, opt_state: the donated inputs' successors, for a further step)."""

    losses: list[float]
    step_times_s: list[float]
    params: Any
    opt_state: Any


def run_timed_steps(compiled, params, opt_state, inputs_BT, targets_BT, *, steps: int,
                    warmup_steps: int, loss_to_host=float) -> TimedSteps:
    """Run warmup_steps + steps of a compiled step; return every loss, the measured step times
    and the final state.

    Each step's outputs are blocked on before its timer stops; params/opt_state are donated
    and threaded through. loss_to_host turns the (possibly sharded) loss into a float.
    """
    losses: list[float] = []
    step_times_s: list[float] = []
    for i in range(warmup_steps + steps):
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, inputs_BT, targets_BT)
        jax.block_until_ready((params, opt_state, loss))
        elapsed = time.perf_counter() - start
        losses.append(loss_to_host(loss))
        if i >= warmup_steps:
            step_times_s.append(elapsed)
    return TimedSteps(losses, step_times_s, params, opt_state)


def one_more_step(compiled, timed: TimedSteps, inputs_BT, targets_BT) -> Callable[[], None]:
    """A callable that runs one further step from the state `timed` ended in (outputs blocked
    on, nothing recorded): the untimed step a profiler may wrap (run_cp_training's
    after_timed_steps). Call it once: the state is donated."""
    def step() -> None:
        jax.block_until_ready(compiled(timed.params, timed.opt_state, inputs_BT, targets_BT))

    return step


def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, steps: int,
                 warmup_steps: int = 1) -> TrainReport:
    """Train on one fixed synthetic batch: warmup_steps untimed steps, then `steps` timed ones.

    As torch_gdn.train: losses cover every step (warm-up included), step_times_s the `steps`
    timed ones (outputs blocked on). Peak memory is measured (device_memory.jax_peak_memory
    over this process's devices); XLA's memory analysis of the compiled step is reported
    beside it as the estimate.
    """
    if not isinstance(steps, int) or not isinstance(warmup_steps, int) or steps < 1 \
            or warmup_steps < 0:
        raise ValueError(f"steps={steps!r} must be >= 1 and warmup_steps={warmup_steps!r} >= 0")
    devices = list(jnp.zeros(()).devices())  # where it runs: jax.default_device honoured
    baseline = device_memory.jax_reset_peak(devices)
    tokens = synthetic_tokens(batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                              vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)
    inputs_BT, targets_BT = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    params = init_model_params(model_cfg, jax.random.PRNGKey(train_cfg.seed))
    opt_state = make_optimizer(train_cfg).init(params)
    step = make_train_step(model_cfg, train_cfg, global_tokens=int(np.prod(inputs_BT.shape)))
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, inputs_BT, targets_BT).compile()
    compile_time_s = time.perf_counter() - start
    estimate = compiled_peak_bytes(compiled)

    losses, step_times_s, *_ = run_timed_steps(compiled, params, opt_state, inputs_BT,
                                               targets_BT, steps=steps,
                                               warmup_steps=warmup_steps)
    peak_bytes, source = device_memory.jax_peak_memory(devices, baseline=baseline)
    return TrainReport(losses=losses, step_times_s=step_times_s, peak_memory_bytes=peak_bytes,
                       memory_source=source, estimated_memory_bytes=estimate,
                       estimated_memory_source=ESTIMATE_SOURCE if estimate is not None else None,
                       compile_time_s=compile_time_s)
