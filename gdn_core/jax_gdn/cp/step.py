"""The context-parallel JAX training step: the whole model in one shard_map over the sequence.

Every chip holds a sequence shard of the batch (tokens [B, T] split on T over `axis`; under
layout="zigzag" the global arrays hold the sequence in cp_layout.shard_order, so chip r's shard
is segments r and 2D−1−r — laid out once by whoever feeds the step, as cp_training_inputs does)
and the weights laid out by train_cfg.param_sharding (param_sharding.py: replicated, zero1 or
fsdp over the same chips). Its loss is (sum of its token losses) / (global token count), so the
chips' losses and parameter gradients each sum to the single-chip ones: the step psums the loss
and reduces the gradients once (WeightLayout.reduce_grads, as train.build_step_fn's
grad_transform), then applies AdamW (zero1: to its slice).

The shard_map runs with check_vma=False: with the check on, JAX would sum each replicated
parameter's gradient itself (the transpose of its implicit per-chip cast, one psum per use),
and the gradient sync would be neither explicit nor separable from the CP exchanges.
A hybrid model (params.is_hf_tree, ModelConfig.layers "hybrid") runs its GDN layers with the
GDN `mode` and its attention layers with `attn_cp` (cp/attention.py), on the same chips, the
rotary embedding at each token's global position.

The settings (a CPSettings: mode, attn_cp, layout, kernels, dp; the shape they split) are
checked against the mesh and the model once, by mesh_cp, which every public entry point
calls first; what it returns, a MeshCP, is what the step's
internals take, and the layers they bind (cp_gdn_layer_unchecked, attention.ATTENTION_CP) do
not check again at every trace.
Fresh weights and AdamW state are created in that layout (sharded_init: jit with
out_shardings, each chip drawing only its shards), the host init's values bit for bit.
Data parallel × CP (batch_axis, a second mesh axis of dp chips): the global batch [dp·B, T]
is split on B over batch_axis and on T over `axis`, so replica d holds rows d·B … (d+1)·B − 1
and splits them over its own D chips. The CP layers exchange over `axis` only (inside a
replica); the loss sum and the weights' layout and gradient reduction span (batch_axis, *axis),
every chip of the mesh (MeshCP.weight_axis). batch_axis None: one replica, the step as before.
Legend: B batch (per replica), T global tokens, t = T/D tokens per chip.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ...config import FULL_ATTENTION, ModelConfig
from ...cp_layout import Layout, shard_order
from ...cp_modes import AttnCPMode, CPMode, CPSettings
from ...kernels import ResolvedKernels
from ...data import synthetic_tokens
from ...train_config import TrainConfig
from ..params import init_model_params
from ..train import StepFn, build_step_fn, make_optimizer
from ..attention_pairs import PairKernelName
from ..kernels import (REFERENCE_GDN, attention_pair_kernel, jax_gdn_rule_kernel,
                       resolve_jax_kernels)
from .attention import (ATTENTION_CP, local_token_positions,
                        segment_table)
from .common import AxisName, axis_names, mesh_chip_count
from .layer import cp_gdn_layer_unchecked
from .param_sharding import WeightLayout, weight_layout


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MeshCP:
    """Where and how a CP step splits the sequence, validated: build it with mesh_cp."""

    mesh: Any
    axis: str | tuple[str, ...]
    """The mesh axis (or axes, flattened major-to-minor) the sequence is split over."""
    settings: CPSettings
    """The trial's CP settings (mode, attn_cp, layout, kernels, dp, chips), checked against
    the mesh and the shape by mesh_cp."""
    attention_kernel: PairKernelName = "reference"
    """The attention segment pairs' kernel `kernels` runs on this mesh (jax_gdn.kernels)."""
    resolved: ResolvedKernels = ResolvedKernels(gdn=REFERENCE_GDN, attention=None)
    """What the step runs, named with versions (attention None: no attention layers); the
    step's report carries it to the trial's result (run_cp_training)."""
    batch_axis: str | None = None
    """The mesh axis of the data-parallel replicas; None: one replica."""

    @property
    def chips(self) -> int:
        """D: the chips of one replica's CP group (the product of `axis`'s sizes)."""
        return self.settings.cp_chips

    @property
    def dp(self) -> int:
        """Replicas: batch_axis's size (1 without one)."""
        return self.settings.dp

    @property
    def mode(self) -> CPMode:
        return self.settings.mode

    @property
    def attn_cp(self) -> AttnCPMode:
        return self.settings.attn_cp

    @property
    def layout(self) -> Layout:
        return self.settings.layout

    @property
    def weight_axis(self) -> AxisName:
        """Axes of the loss sum and of the weights' layout and gradient reduction: every chip
        of the mesh, (batch_axis, *axis); `axis` itself with one replica (the step as before)."""
        return weight_axes(self.axis, self.batch_axis)

    @property
    def mesh_chips(self) -> int:
        """dp × D: the chips the weights are laid out over."""
        return self.settings.chips

    @property
    def token_spec(self) -> P:
        """Tokens [dp·B, T]: rows over batch_axis (replicated if None), the sequence over axis."""
        return P(self.batch_axis, self.axis)


def mesh_cp(model_cfg: ModelConfig, seq_len: int, *, mesh, axis: AxisName, cp: CPSettings,
            dtype: str = "float32", batch_axis: str | None = None) -> MeshCP:
    """Check `cp` against the mesh and model_cfg at seq_len global tokens, once per trial, and
    resolve its kernels here (the one resolver's answer, jax_gdn.kernels.resolve_jax_kernels).

    batch_axis: the mesh axis of the cp.dp data-parallel replicas (replica_count), or None
    (then cp.dp must be 1). Raises ValueError naming the numbers: an axis the mesh lacks,
    `axis` not spanning cp.cp_chips chips or batch_axis not cp.dp, or a shape the settings
    cannot split (CPSettings.check_shape); KernelUnavailable with the reason when
    kernels="fused" has no attention kernel for the mesh's backend, `dtype` (the compute
    dtype) or the shape (jax_gdn.kernels).
    """
    if cp.dp > 1 and batch_axis is None:
        raise ValueError(f"cp.dp={cp.dp} needs batch_axis: the mesh axis of the {cp.dp} "
                         "data-parallel replicas")
    chips = mesh_chip_count(mesh, axis)
    dp = replica_count(mesh, batch_axis, axis=axis)
    if dp != cp.dp:
        raise ValueError(f"cp.dp={cp.dp} but batch_axis {batch_axis!r} spans {dp} chips")
    if chips != cp.cp_chips:
        per_replica = "" if cp.dp == 1 else f" / cp.dp={cp.dp} = {cp.cp_chips} CP chips,"
        raise ValueError(f"cp.chips={cp.chips}{per_replica} but mesh axis {axis!r} spans "
                         f"{chips} chips")
    cp.check_shape(model_cfg, seq_len)
    backend = mesh.devices.flat[0].platform
    attention_kernel, head_dim, pair_len = "reference", None, None
    if FULL_ATTENTION in model_cfg.layer_pattern:
        attention_kernel = attention_pair_kernel(cp.kernels, backend=backend)
        head_dim = model_cfg.attention.head_dim
        # Ulysses attends the whole sequence as one pair; the others a chip's segments.
        pair_len = seq_len if cp.attn_cp == "ulysses" else seq_len // (
            chips * segment_table(chips, cp.layout).shape[1])
    resolved = resolve_jax_kernels(cp.kernels, backend=backend, dtype=dtype, head_dim=head_dim,
                                   segment_len=pair_len)
    return MeshCP(mesh=mesh, axis=axis if isinstance(axis, str) else tuple(axis), settings=cp,
                  attention_kernel=attention_kernel, resolved=resolved, batch_axis=batch_axis)


def replica_count(mesh, batch_axis: str | None, *, axis: AxisName) -> int:
    """dp: the size of mesh axis batch_axis (1 for None). ValueError when the mesh lacks it or
    it is one of the sequence axes `axis`."""
    if batch_axis is None:
        return 1
    if not isinstance(batch_axis, str) or batch_axis not in mesh.axis_names:
        raise ValueError(f"batch_axis={batch_axis!r} must name one axis of the mesh "
                         f"{tuple(mesh.axis_names)}")
    if batch_axis in axis_names(axis):
        raise ValueError(f"batch_axis={batch_axis!r} is also a sequence axis (axis={axis!r}): "
                         "the replicas need an axis of their own")
    return mesh.shape[batch_axis]


def weight_axes(axis: AxisName, batch_axis: str | None) -> AxisName:
    """MeshCP.weight_axis for unvalidated arguments: (batch_axis, *axis), or axis."""
    axis = axis if isinstance(axis, str) else tuple(axis)
    return axis if batch_axis is None else (batch_axis, *axis_names(axis))


def model_hooks(cp: MeshCP, seq_len: int) -> dict:
    """The CP layers of build_step_fn / model_loss: GDN under cp.mode, attention under
    cp.attn_cp with cp.attention_kernel's segment pairs (unchecked: mesh_cp validated them),
    and this chip's global token positions (rotary)."""
    return {"gdn_layer_fn": gdn_layer_fn(cp),
            "attend_fn": functools.partial(ATTENTION_CP[cp.attn_cp], axis=cp.axis,
                                           layout=cp.layout, kernel=cp.attention_kernel),
            "positions_fn": lambda: local_token_positions(cp.axis, seq_len // cp.chips,
                                                          cp.layout)}


def gdn_layer_fn(cp: MeshCP):
    """The GDN layer the step runs for cp.settings.kernels: the one place the JAX step picks
    its GDN implementation. reference: this package's chunk rule through the CP layers; fused:
    the Pallas chunk rule for the mesh's backend as the layers' rule kernel
    (jax_gdn.kernels.jax_gdn_rule_kernel; its name, resolve_jax_gdn_kernel's, is
    cp.resolved.gdn, which the report carries). The step's shard_map runs with
    check_vma=False, which the Pallas kernel needs."""
    kernel = jax_gdn_rule_kernel(cp.settings.kernels, backend=cp.mesh.devices.flat[0].platform)
    return functools.partial(cp_gdn_layer_unchecked, axis=cp.axis, mode=cp.mode,
                             layout=cp.layout, rule_kernel=kernel)


@functools.lru_cache(maxsize=16)
def _param_shapes(model_cfg: ModelConfig):
    """The model's parameters as jax.ShapeDtypeStruct (nothing allocated)."""
    return jax.eval_shape(lambda: init_model_params(model_cfg, jax.random.PRNGKey(0)))


def weight_specs(model_cfg: ModelConfig, train_cfg: TrainConfig, axis,
                 chips: int) -> tuple[WeightLayout, Any, Any]:
    """(WeightLayout, param specs, opt_state specs) of the step's weights."""
    layout = weight_layout(train_cfg.param_sharding, _param_shapes(model_cfg), chips=chips,
                           axis=axis)
    optimizer = make_optimizer(train_cfg)
    opt_shapes = jax.eval_shape(optimizer.init, _param_shapes(model_cfg))
    return layout, layout.param_specs(), layout.opt_state_specs(optimizer, opt_shapes)


def build_cp_step_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                     cp: CPSettings, batch_axis: str | None = None) -> StepFn:
    """The un-jitted, shard_mapped step; see make_cp_train_step."""
    return _shard_mapped_step(model_cfg, train_cfg, mesh_cp(
        model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp, dtype=train_cfg.dtype,
        batch_axis=batch_axis))


LOSS_SUM_SCOPE = "loss_sum"
"""The named scope of the global loss's sum over the chips (train.comm_bytes_per_chip counts
it as CP traffic)."""


def _shard_mapped_step(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: MeshCP) -> StepFn:
    weights, param_specs, opt_specs = weight_specs(model_cfg, train_cfg, cp.weight_axis,
                                                   cp.mesh_chips)
    step = build_step_fn(
        model_cfg, train_cfg, global_tokens=cp.dp * train_cfg.batch_size * train_cfg.seq_len,
        grad_transform=weights.reduce_grads, fetch=weights.fetch(),
        apply_update=weights.apply_update(make_optimizer(train_cfg)),
        **model_hooks(cp, train_cfg.seq_len))

    def shard_step(params, opt_state, inputs_Bt, targets_Bt):
        params, opt_state, loss_share = step(params, opt_state, inputs_Bt, targets_Bt)
        with jax.named_scope(LOSS_SUM_SCOPE):
            loss = lax.psum(loss_share, cp.weight_axis)
        return params, opt_state, loss

    seq = cp.token_spec
    return jax.shard_map(shard_step, mesh=cp.mesh, in_specs=(param_specs, opt_specs, seq, seq),
                         out_specs=(param_specs, opt_specs, P()), check_vma=False)


def make_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, cp: CPSettings, batch_axis: str | None = None) -> StepFn:
    """Jitted step(params, opt_state, inputs_BT, targets_BT) -> (params, opt_state, loss).

    params, opt_state: global arrays laid out as cp_training_inputs makes them (per
    train_cfg.param_sharding; donated: do not reuse the passed-in ones). inputs_BT,
    targets_BT: int [B, T] global, T split over mesh axis `axis` (a name or a tuple flattened
    major-to-minor; D = the product of their sizes = cp.cp_chips), in
    cp_layout.shard_order(cp.layout) (the identity for contiguous). cp: the CP settings
    (GDN mode, the attention layers' attn_cp in hybrid models, layout, kernels, dp; checked
    once, mesh_cp). loss: the global mean loss (float32, replicated).
    batch_axis: the mesh axis of the cp.dp replicas; inputs_BT, targets_BT are then
    [dp·B, T], rows split over it (B = train_cfg.batch_size per replica), and the loss is the
    mean over all dp·B·T tokens. The update equals one chip's AdamW step on the summed
    gradients (of the whole global batch). The same arguments return
    the same jitted function, so `.lower(...).compile()` of equal shapes and shardings
    compiles once per process (compile_cp_train_step relies on it).
    Raises ValueError naming the numbers when cp cannot split train_cfg's shape over D,
    KernelUnavailable with the reason when kernels="fused" cannot serve it.
    """
    return jitted_step(model_cfg, train_cfg, mesh_cp(
        model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp, dtype=train_cfg.dtype,
        batch_axis=batch_axis))


@functools.lru_cache(maxsize=32)
def jitted_step(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: MeshCP) -> StepFn:
    """make_cp_train_step for validated settings. Cached: pass the same arguments
    positionally, as the callers do, to hit the same entry."""
    return jax.jit(_shard_mapped_step(model_cfg, train_cfg, cp), donate_argnums=(0, 1))


def global_arrays(tree, shardings):
    """Global arrays from host values that every process holds in full.

    make_array_from_callback asks each process only for its own devices' shards, so the same
    code feeds a single- or multi-process mesh. shardings: one, or a tree matching `tree`.
    """
    def one(x, sharding):
        x_np = np.asarray(x)
        return jax.make_array_from_callback(x_np.shape, sharding, lambda index: x_np[index])

    if isinstance(shardings, NamedSharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


def host_copy(tree, mesh=None):
    """numpy copies of global arrays; sharded ones (pass their mesh) are gathered first."""
    if mesh is not None:
        tree = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def synthetic_batch(model_cfg: ModelConfig, train_cfg: TrainConfig, dp: int = 1) -> np.ndarray:
    """The run's global batch of token ids [dp·B, T+1] (int32, host): gdn_core.data.
    synthetic_tokens of the config (replica d's rows: d·B … (d+1)·B − 1)."""
    return synthetic_tokens(batch_size=dp * train_cfg.batch_size, seq_len=train_cfg.seq_len,
                            vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)


def _named(mesh, specs):
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                        is_leaf=lambda x: isinstance(x, P))


def cp_training_inputs(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, params=None, layout: Layout = "contiguous",
                       batch_axis: str | None = None):
    """(params, opt_state, inputs_BT, targets_BT) as global arrays for make_cp_train_step.

    Fresh weights (seed train_cfg.seed) and AdamW state are created in their layout
    (train_cfg.param_sharding) by sharded_init: no chip ever holds a whole copy of what is
    sharded. A host pytree `params` given (e.g. params.from_state_dict of a checkpoint) is
    laid out shard by shard, its fresh AdamW state created sharded (sharded_optimizer_init).
    The synthetic batch's inputs tokens[:, :-1] and targets tokens[:, 1:] [B, T], T split
    over `axis` in cp_layout.shard_order(layout). batch_axis (dp replicas): the global batch
    [dp·B, T], rows over batch_axis; the weights laid out over every chip of the mesh. Call
    on every process of a multi-process mesh (each creates or feeds only its own devices'
    shards).
    """
    axis = axis if isinstance(axis, str) else tuple(axis)
    D, dp = mesh_chip_count(mesh, axis), replica_count(mesh, batch_axis, axis=axis)
    weight_axis = weight_axes(axis, batch_axis)
    _, param_specs, _ = weight_specs(model_cfg, train_cfg, weight_axis, dp * D)
    tokens_BT1 = synthetic_batch(model_cfg, train_cfg, dp)
    order = shard_order(chips=D, seq_len=train_cfg.seq_len, layout=layout)
    if params is None:
        params, opt_state = sharded_init(model_cfg, train_cfg, mesh, weight_axis)()
    else:
        params = global_arrays(params, _named(mesh, param_specs))
        opt_state = sharded_optimizer_init(model_cfg, train_cfg, mesh, weight_axis)(params)
    return (params, opt_state,
            *global_arrays((tokens_BT1[:, :-1][:, order], tokens_BT1[:, 1:][:, order]),
                           NamedSharding(mesh, P(batch_axis, axis))))


def _target_shardings(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh, axis):
    """(params, opt_state) NamedShardings of the step's weight layout on `mesh`."""
    _, param_specs, opt_specs = weight_specs(model_cfg, train_cfg, axis,
                                             mesh_chip_count(mesh, axis))
    return _named(mesh, param_specs), _named(mesh, opt_specs)


@functools.lru_cache(maxsize=16)
def sharded_init(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh, axis: AxisName):
    """Jitted init() -> (params, opt_state): fresh weights (seed train_cfg.seed) and AdamW
    state, created directly in the step's layout (weight_specs) through jit's out_shardings.

    XLA partitions the init like any program: each chip draws and zeroes only its own shards
    (a multi-process mesh included, no host copy), so zero1's moments and fsdp's weights
    never exist whole on one chip. With jax_threefry_partitionable (jax's default) the
    random bits do not depend on the sharding, so the values are
    init_model_params(model_cfg, PRNGKey(train_cfg.seed))'s bit for bit, and a CP-vs-one-
    chip verify compares the same weights. axis: the axes the weights are laid out over (the
    step's MeshCP.weight_axis: the sequence axis, with dp replicas (batch_axis, *axis)), a
    name or a tuple (hashable: cached).
    """
    param_shardings, opt_shardings = _target_shardings(model_cfg, train_cfg, mesh, axis)
    optimizer = make_optimizer(train_cfg)

    def init():
        params = init_model_params(model_cfg, jax.random.PRNGKey(train_cfg.seed))
        return params, optimizer.init(params)

    return jax.jit(init, out_shardings=(param_shardings, opt_shardings))


@functools.lru_cache(maxsize=16)
def sharded_optimizer_init(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh,
                           axis: AxisName):
    """Jitted init(params) -> opt_state: fresh AdamW state of laid-out params, created in its
    layout (sharded_init's, for weights given rather than drawn)."""
    _, opt_shardings = _target_shardings(model_cfg, train_cfg, mesh, axis)
    return jax.jit(make_optimizer(train_cfg).init, out_shardings=opt_shardings)


def cp_step_shapes(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                   batch_axis: str | None = None):
    """cp_training_inputs as jax.ShapeDtypeStruct (shapes, dtypes, shardings; no data)."""
    axis = axis if isinstance(axis, str) else tuple(axis)
    dp, weight_axis = replica_count(mesh, batch_axis, axis=axis), weight_axes(axis, batch_axis)
    _, param_specs, opt_specs = weight_specs(model_cfg, train_cfg, weight_axis,
                                             mesh_chip_count(mesh, weight_axis))
    params = _param_shapes(model_cfg)
    opt_state = jax.eval_shape(make_optimizer(train_cfg).init, params)

    def shaped(tree, specs):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, _named(mesh, specs))

    tokens_BT = jax.ShapeDtypeStruct((dp * train_cfg.batch_size, train_cfg.seq_len), jnp.int32,
                                     sharding=NamedSharding(mesh, P(batch_axis, axis)))
    return shaped(params, param_specs), shaped(opt_state, opt_specs), tokens_BT, tokens_BT
