"""Predict a training step's memory per chip from shapes and step settings alone (no compile).

`step.predict_step_memory` is the one answer to "will it fit?": the verify decision (which
prefix of the sequence one chip can check), the service's admission control and the capacity
planner all call it. All figures are bytes per chip. By job:

    step.py              predict_step_memory: the step's peak, part by part (MemoryPrediction)
    kernel_workspace.py  a fused kernel's own buffers (fla-core's, estimated from its source)
    parameters.py        parameter shapes and counts: the model a chip trains, sharded or not
    activations.py       what the layers keep for backward per token, the CP exchange buffers
    verify.py            the verify reference beside the step: which prefix of the sequence fits

What a device measures (allocator peaks, RSS) is gdn_core.device_memory.
"""
