"""Suite-wide set-up: 8 virtual CPU chips for JAX (must happen before JAX first runs)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
