"""Weights, gradients and AdamW state over the CP chips: replicated, zero1 or fsdp.

The CP chips double as the data/FSDP axis (MaxText's ici_fsdp × context meshes), and with
data-parallel replicas (cp/step.py's batch_axis) the weights span those too: `axis` is then
(batch_axis, *CP axes) and D all dp × CP chips of the mesh. Inside the step's shard_map each
chip holds, per leaf, either the whole array or its 1/D slice along one
dim — the largest dim divisible by D, never the stacking axis of params["block"] (so every
layer's slice is itself sharded and can be gathered inside the scan body). A leaf with no such
dim stays replicated (`replicated_leaves` names them).

    replicated  grads psum'd; every chip runs the same AdamW update on whole arrays.
    zero1       grads psum_scatter'd; each chip updates its slice of params with its slice of
                the AdamW state; the updated slices are all_gather'd back (float32 masters).
    fsdp        params, grads, AdamW state sharded. model.Fetch gathers each layer's weights
                (cast to the compute dtype first, so bf16 moves half the bytes) inside the
                scan body, named model.GATHERED_WEIGHTS so no remat policy keeps them: backward
                gathers again. The gather's backward reduce-scatters the gradient in float32.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from ...train_config import PARAM_SHARDINGS
from ..model import GATHERED_WEIGHTS, Fetch, cast_fetch
from ..params import Params
from ..train import ApplyUpdate
from .common import AxisName, chip_count, chip_index

REPLICATED = -1
"""shard_dims' mark of a leaf every chip holds whole."""


def _shard_dim(shape: tuple[int, ...], chips: int, first: int) -> int:
    """The largest dim (from `first` on) divisible by chips; REPLICATED if none (or chips = 1)."""
    candidates = [(size, -d) for d, size in enumerate(shape) if d >= first and size % chips == 0]
    return -max(candidates)[1] if chips > 1 and candidates else REPLICATED


def shard_dims(params: Params, chips: int) -> Params:
    """Per leaf of a model tree (arrays or shapes), the dim sharded over `chips` or REPLICATED."""
    def dims(tree, first):
        return jax.tree.map(lambda x: _shard_dim(tuple(x.shape), chips, first), tree)

    return {key: dims(value, first=1 if key == "block" else 0) for key, value in params.items()}


def replicated_leaves(params: Params, chips: int) -> list[str]:
    """Paths of the leaves no dim of which divides by chips (kept whole on every chip)."""
    return [jax.tree_util.keystr(path) for path, dim in
            jax.tree_util.tree_leaves_with_path(shard_dims(params, chips)) if dim == REPLICATED]


def _spec(dim: int, axis: AxisName) -> P:
    return P() if dim == REPLICATED else P(*([None] * dim), axis)


WEIGHT_SYNC_SCOPE = "weight_sync"
"""The named scope of every collective that moves weights or their gradients (not CP
traffic): hlo_comm finds them by it in the compiled step's metadata."""


def _weight_sync(collective):
    """`collective` under WEIGHT_SYNC_SCOPE."""
    def scoped(*args, **kwargs):
        with jax.named_scope(WEIGHT_SYNC_SCOPE):
            return collective(*args, **kwargs)
    return scoped


_all_gather = _weight_sync(lax.all_gather)
_psum = _weight_sync(lax.psum)
_psum_scatter = _weight_sync(lax.psum_scatter)


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _gather(shard, dim: int, axis: AxisName, dtype):
    return _all_gather(shard.astype(dtype), axis, axis=dim, tiled=True)


def _gather_fwd(shard, dim, axis, dtype):
    return _gather(shard, dim, axis, dtype), None


def _gather_bwd(dim, axis, dtype, _, cotangent):
    del dtype  # the gradient is summed in float32 whatever the compute dtype
    return (_psum_scatter(cotangent.astype(jnp.float32), axis, scatter_dimension=dim,
                          tiled=True),)


_gather.defvjp(_gather_fwd, _gather_bwd)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightLayout:
    """How one step lays out its weights (module docstring); built by weight_layout."""

    sharding: str
    """replicated, zero1 or fsdp."""
    axis: AxisName
    """The mesh axes the weights span (a name or a tuple of names): the CP axis, or
    (batch_axis, *CP axes) on a dp × CP mesh."""
    dims: Params
    """shard_dims of the model tree (used by zero1 and fsdp)."""

    def _sharded(self, tree_dims):
        return jax.tree.map(lambda d: _spec(d, self.axis), tree_dims)

    def param_specs(self) -> Params:
        """PartitionSpecs of the params (fsdp: sharded; otherwise whole on every chip)."""
        return self._sharded(self.dims) if self.sharding == "fsdp" else jax.tree.map(
            lambda _: P(), self.dims)

    def grad_specs(self) -> Params:
        """PartitionSpecs of the reduced gradients (zero1 and fsdp: sharded like the state)."""
        return jax.tree.map(lambda _: P(), self.dims) if self.sharding == "replicated" else \
            self._sharded(self.dims)

    def opt_state_specs(self, optimizer: optax.GradientTransformation, opt_state) -> object:
        """PartitionSpecs of an optimizer state (its param-shaped parts sharded like grads)."""
        return optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state,
                                     self.grad_specs(), transform_non_params=lambda _: P(),
                                     is_leaf=lambda x: isinstance(x, P))

    def fetch(self) -> Fetch:
        """model.Fetch: a cast, or under fsdp a per-layer gather (named GATHERED_WEIGHTS)."""
        if self.sharding != "fsdp":
            return cast_fetch

        def fetch(name: str, tree: Params, dtype) -> Params:
            if name.startswith("block."):  # one layer: its stacking axis is already sliced off
                tree_dims = jax.tree.map(lambda d: d - 1 if d != REPLICATED else d,
                                         self.dims["block"][int(name.split(".")[1])])
            else:
                tree_dims = self.dims[name]
            return jax.tree.map(lambda x, d: x.astype(dtype) if d == REPLICATED else
                                checkpoint_name(_gather(x, d, self.axis, jnp.dtype(dtype)),
                                                GATHERED_WEIGHTS), tree, tree_dims)
        return fetch

    def reduce_grads(self, grads: Params) -> Params:
        """This chip's gradient contributions -> the summed gradients in grad_specs' layout."""
        def reduce(g, d):
            if d == REPLICATED or self.sharding == "replicated":
                return _psum(g, self.axis)
            if self.sharding == "zero1":
                return _psum_scatter(g, self.axis, scatter_dimension=d, tiled=True)
            return g  # fsdp: the gather's backward already reduce-scattered it
        return jax.tree.map(reduce, grads, self.dims)

    def apply_update(self, optimizer: optax.GradientTransformation) -> ApplyUpdate | None:
        """zero1's update (slice, AdamW on the slices, gather back); None: the plain update."""
        if self.sharding != "zero1":
            return None

        def shard_of(x, d):
            if d == REPLICATED:
                return x
            size = x.shape[d] // chip_count(self.axis)
            return lax.dynamic_slice_in_dim(x, chip_index(self.axis) * size, size, axis=d)

        def apply(grad_shards, opt_state, params):
            param_shards = jax.tree.map(shard_of, params, self.dims)
            updates, opt_state = optimizer.update(grad_shards, opt_state, param_shards)
            new_shards = optax.apply_updates(param_shards, updates)
            return jax.tree.map(
                lambda x, d: x if d == REPLICATED else _all_gather(x, self.axis, axis=d,
                                                                   tiled=True),
                new_shards, self.dims), opt_state
        return apply


def weight_layout(sharding: str, params: Params, *, chips: int, axis: AxisName) -> WeightLayout:
    """The WeightLayout of `sharding` for a model tree (arrays or shapes) over `chips`."""
    if sharding not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding={sharding!r} is not one of: "
                         f"{', '.join(PARAM_SHARDINGS)}")
    return WeightLayout(sharding=sharding, axis=axis, dims=shard_dims(params, chips))
