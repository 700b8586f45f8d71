"""Layers the scripts share, written for speed on a CPU where the library's own is slow."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np


def conv_relu_pool(obs: jax.Array, channels: int, xla_conv: bool = False) -> jax.Array:
    """hk.Conv2D(channels, 3x3, zero padding) -> ReLU -> hk.avg_pool(2x2), with the parameters
    `conv/w` and `conv/b`: (N, H, W, C) -> (N, H // 2, W // 2, channels).

    The same numbers, computed as one matrix product per 2x2 output block: the block's 4x4 window
    of the padded grid times the filters placed at its four cells. XLA's CPU convolution is slow at
    MinAtar's size (the speed benchmarks); tests/test_utils_layers.py holds the two equal. With
    `xla_conv`, Haiku's layers themselves: a TPU runs its own convolution faster.
    """
    w_init = hk.initializers.Orthogonal(np.sqrt(2))
    if xla_conv:
        x = hk.Conv2D(channels, kernel_shape=3, padding="SAME", w_init=w_init, name="conv")(obs)
        return hk.avg_pool(jax.nn.relu(x), window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1),
                           padding="VALID")
    n, height, width, c = obs.shape
    rows, cols = height // 2, width // 2
    with hk.name_scope("conv"):
        w = hk.get_parameter("w", (3, 3, c, channels), init=w_init)
        b = hk.get_parameter("b", (channels,), init=jnp.zeros)
    # The filters at the block's cells (u, v) in its 4x4 window: (4 * 4 * c, 2 * 2 * channels).
    w4 = jnp.stack([jnp.pad(w, ((u, 1 - u), (v, 1 - v), (0, 0), (0, 0)))
                    for u in (0, 1) for v in (0, 1)], axis=-2).reshape(16 * c, 4 * channels)
    # Each block's window: rows 2i..2i+3 and columns 2j..2j+3 of the padded grid. Cut by hand:
    # lax.conv_general_dilated_patches is a convolution too, and its gradient is slower here.
    padded = jnp.pad(obs, ((0, 0), (1, 1), (1, 1), (0, 0)))[:, :2 * rows + 2, :2 * cols + 2]
    pairs = padded.reshape(n, rows + 1, 2, cols + 1, 2, c)
    pairs = jnp.concatenate([pairs[:, :-1], pairs[:, 1:]], axis=2)  # (n, rows, 4, cols + 1, 2, c)
    windows = jnp.concatenate([pairs[:, :, :, :-1], pairs[:, :, :, 1:]], axis=4)
    windows = windows.transpose(0, 1, 3, 2, 4, 5).reshape(n, rows, cols, 16 * c)
    cells = jax.nn.relu(windows @ w4 + jnp.tile(b, 4))
    return cells.reshape(n, rows, cols, 4, channels).mean(axis=3)


def conv_valid(obs: jax.Array, channels: int) -> jax.Array:
    """hk.Conv2D(channels, 3x3, padding="VALID") with He-normal filters, the parameters `conv/w`
    and `conv/b`: (N, H, W, C) -> (N, H - 2, W - 2, channels), no activation.

    The same numbers, computed as one matrix product of each cell's 3x3 window (cut by slicing) and
    the flattened filters, for the reason conv_relu_pool gives; tests/test_utils_layers.py holds
    the two equal."""
    n, height, width, c = obs.shape
    with hk.name_scope("conv"):
        w = hk.get_parameter("w", (3, 3, c, channels), init=hk.initializers.VarianceScaling(2.0))
        b = hk.get_parameter("b", (channels,), init=jnp.zeros)
    windows = jnp.concatenate([obs[:, u:u + height - 2, v:v + width - 2]
                               for u in range(3) for v in range(3)], axis=-1)
    return windows @ w.reshape(9 * c, channels) + b
