"""gdn_core: the Gated DeltaNet math measured by gdn-sweep.

Sub-packages `torch_gdn` and `jax_gdn` hold the rule, layer, model, context-parallel modes and
training step for each framework; `config`, `presets` and `flops` are shared. Imports nothing
beyond numpy, torch, jax and optax.
"""
