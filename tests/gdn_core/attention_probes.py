"""Probes of JAX attention for the tests: run it as the decoder does, count the tiles it runs."""

from jax import lax

from gdn_core.jax_gdn import attention as attention_module


def through_layers(attend, layers: int = 2):
    """attend(q, k, v) applied `layers` times in a lax.scan, each output the next queries.

    A memory test measures attention where the model calls it: a scan's autodiff once split
    the tile loops of the backward, stacking every tile's scores ([T, T] per head), which a
    lone call's gradient did not show."""
    def scanned(q, k, v):
        o, _ = lax.scan(lambda x, _: (attend(x, k, v), None), q, None, length=layers)
        return o
    return scanned


def count_tile_calls(monkeypatch, on_tile):
    """Patch attention's tile functions so that each, when traced, calls on_tile(name, kind)
    (name forward / backward, kind full: no mask, or masked); on_tile installs the
    jax.debug.callback that counts the tile each time it runs."""
    def counting(name, fn, q_pos_at):
        def wrapped(*args):
            on_tile(name, "full" if args[q_pos_at] is None else "masked")
            return fn(*args)
        return wrapped

    monkeypatch.setattr(attention_module, "_merge_tile",
                        counting("forward", attention_module._merge_tile, 4))
    monkeypatch.setattr(attention_module, "_tile_grads",
                        counting("backward", attention_module._tile_grads, 6))
