"""gdn_core: the Gated DeltaNet math measured by gdn-sweep.

Sub-packages `torch_gdn` and `jax_gdn` hold the rule, layer, model, context-parallel modes and
training step for each framework; shared by both: `config`, `presets`, the `flops` package
(model and hardware FLOP counts, MFU) and the `memory` package (the step's memory prediction).
Imports nothing beyond numpy, torch, jax and optax.
"""
