"""Tests of utils/layers.py: the fast grid convolution computes what Haiku's layers compute."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from utils import layers


@pytest.mark.parametrize("height, width", [(10, 10), (7, 9)])  # MinAtar's grid, and odd sides
def test_conv_relu_pool_equals_haikus_conv2d_relu_and_avg_pool(height, width):
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, height, width, 4)).astype(jnp.float32)
    fast = hk.without_apply_rng(hk.transform(lambda o: layers.conv_relu_pool(o, 3)))
    params = fast.init(jax.random.key(1), obs)
    assert jax.tree.map(jnp.shape, params) == {"conv": {"w": (3, 3, 4, 3), "b": (3,)}}
    # Random filters and biases (the biases start at 0), so that each channel's bias shows.
    params = {"conv": {"w": jax.random.normal(jax.random.key(2), (3, 3, 4, 3)),
                       "b": jax.random.normal(jax.random.key(3), (3,))}}

    def reference(o):
        x = jax.nn.relu(hk.Conv2D(3, kernel_shape=3, padding="SAME", name="conv")(o))
        return hk.avg_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")

    expected = hk.without_apply_rng(hk.transform(reference)).apply(params, obs)
    assert expected.shape == (2, height // 2, width // 2, 3)
    np.testing.assert_allclose(fast.apply(params, obs), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xla_conv", [False, True])  # the matrix products, and XLA's convolution
@pytest.mark.parametrize("height, width", [(10, 10), (7, 9)])  # MinAtar's grid, and odd sides
def test_the_grid_convolution_is_one_3x3_filter_bank_at_every_cell_then_2x2_means(height, width,
                                                                                  xla_conv):
    # Written out cell by cell: zero padding at the edges (the output keeps the grid's size before
    # pooling), ReLU, then the mean of each 2x2 block.
    conv = hk.without_apply_rng(hk.transform(lambda o: layers.conv_relu_pool(o, 3, xla_conv)))
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, height, width, 4)).astype(jnp.float32)
    params = conv.init(jax.random.key(1), obs)
    assert params["conv"]["w"].shape == (3, 3, 4, 3) and params["conv"]["b"].shape == (3,)
    # Random filters and biases (the biases start at 0), so that each channel's bias shows.
    params = {"conv": {"w": jax.random.normal(jax.random.key(2), (3, 3, 4, 3)),
                       "b": jax.random.normal(jax.random.key(3), (3,))}}
    w, b = (np.asarray(params["conv"][k], np.float64) for k in ("w", "b"))
    padded = np.pad(np.asarray(obs, np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    cells = np.zeros((2, height, width, 3))
    for y in range(height):
        for x in range(width):
            cells[:, y, x] = np.einsum("nijc,ijcf->nf", padded[:, y:y + 3, x:x + 3], w) + b
    rows, cols = height // 2, width // 2  # an odd last row or column is dropped
    expected = np.maximum(cells[:, :2 * rows, :2 * cols], 0).reshape(2, rows, 2, cols, 2, 3)
    expected = expected.mean(axis=(2, 4))
    np.testing.assert_allclose(conv.apply(params, obs), expected, rtol=1e-5, atol=1e-6)


def test_both_ways_of_the_grid_convolution_start_from_the_same_parameters():
    # A script that picks the way by its device trains the same network from the same seed.
    obs = jnp.zeros((1, 10, 10, 4))
    params = [hk.without_apply_rng(hk.transform(
        lambda o, x=xla_conv: layers.conv_relu_pool(o, 8, x))).init(jax.random.key(5), obs)
        for xla_conv in (False, True)]
    jax.tree.map(np.testing.assert_array_equal, *params)
    assert float(jnp.abs(params[0]["conv"]["w"]).min()) > 0


@pytest.mark.parametrize("height, width", [(10, 10), (7, 9)])  # MinAtar's grid, and odd sides
def test_conv_valid_equals_haikus_unpadded_conv2d(height, width):
    # The same grid and random filters as the pooled layer's test above.
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, height, width, 4)).astype(jnp.float32)
    fast = hk.without_apply_rng(hk.transform(lambda o: layers.conv_valid(o, 3)))
    params = {"conv": {"w": jax.random.normal(jax.random.key(2), (3, 3, 4, 3)),
                       "b": jax.random.normal(jax.random.key(3), (3,))}}
    assert jax.tree.map(jnp.shape, fast.init(jax.random.key(1), obs)) == jax.tree.map(
        jnp.shape, params)
    reference = hk.without_apply_rng(hk.transform(
        lambda o: hk.Conv2D(3, kernel_shape=3, padding="VALID", name="conv")(o)))
    expected = reference.apply(params, obs)
    assert expected.shape == (2, height - 2, width - 2, 3)
    np.testing.assert_allclose(fast.apply(params, obs), expected, rtol=1e-5, atol=1e-5)


def test_conv_valid_starts_he_normal_as_purejaxqls_flax_convolution():
    # flax's he_normal: a truncated normal of variance 2 / fan_in, fan_in = 3 * 3 * channels in.
    obs = jnp.zeros((1, 10, 10, 8))
    w = hk.without_apply_rng(hk.transform(lambda o: layers.conv_valid(o, 256))).init(
        jax.random.key(0), obs)["conv"]["w"]
    assert abs(float(jnp.std(w)) - np.sqrt(2 / 72)) < 0.01
