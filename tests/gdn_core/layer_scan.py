"""Attention as the decoder runs it: inside the layer scan."""

from jax import lax


def through_layers(attend, layers: int = 2):
    """attend(q, k, v) applied `layers` times in a lax.scan, each output the next queries.

    A memory test measures attention where the model calls it: a scan's autodiff once split
    the tile loops of the backward, stacking every tile's scores ([T, T] per head), which a
    lone call's gradient did not show."""
    def scanned(q, k, v):
        o, _ = lax.scan(lambda x, _: (attend(x, k, v), None), q, None, length=layers)
        return o
    return scanned
