"""Tests of utils/diagnostics.py: the training diagnostics against numpy, on one device and on a
batch split over two."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ppo_breakout as ppo
from utils import diagnostics, parallel


def test_training_diagnostics_against_numpy_on_one_and_two_devices():
    rng = np.random.default_rng(0)
    n = 64
    actions = np.r_[np.zeros(32), np.ones(16), 2 * np.ones(16)]
    batch = ppo.Batch(obs=jnp.zeros((n, 1)), action=jnp.asarray(actions, jnp.int32),
                      logits=jnp.asarray(rng.normal(size=(n, 3)) * 5, jnp.float32),
                      value=jnp.asarray(rng.normal(size=n), jnp.float32),
                      advantage=jnp.asarray(rng.normal(loc=2.0, size=n), jnp.float32),
                      target=jnp.asarray(rng.normal(size=n), jnp.float32))
    b = jax.device_get(batch)
    # Units 0-3 fired on device 0's share, units 2-5 on device 1's; 6 and 7 on neither: 2 of 8
    # silent.
    active = jnp.array([[1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0]], bool)
    # Each device's log-ratios, (epochs=1, minibatches=2, rows=2); 2.0 lies beyond the histogram.
    log_ratio = jnp.array([[[[-0.3, 0.1], [0.2, 0.5]]], [[[-0.1, 0.0], [0.4, 2.0]]]])
    expected = {
        "logit_gap_max": (b.logits.max(1) - b.logits.min(1)).max(),
        "advantage_mean": b.advantage.mean(), "advantage_std": b.advantage.std(),
        "value_error": np.sqrt(np.mean((b.target - b.value) ** 2)),
        "silent_units": 2 / 8, "log_ratio_min": -0.3, "log_ratio_max": 2.0,
    }
    log_ratio = jnp.concatenate([log_ratio[0], log_ratio[1]], axis=-1)
    single = jax.jit(diagnostics.training_diagnostics)(batch, active.any(axis=0), log_ratio)
    # The same, with the batch and log-ratios split over two devices as the data-parallel step
    # leaves them: XLA adds the reductions.
    mesh = parallel.make_mesh(2)
    sharded = jax.jit(diagnostics.training_diagnostics)(
        jax.device_put(batch, NamedSharding(mesh, P("envs"))), active.any(axis=0),
        jax.device_put(log_ratio, NamedSharding(mesh, P(None, None, "envs"))))
    for result in (single, sharded):
        for name, value in expected.items():
            np.testing.assert_allclose(result[name], value, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(result["action_frequency"], [0.5, 0.25, 0.25])
        for name, data in (("logits", b.logits), ("value", b.value), ("advantage", b.advantage)):
            h = result["histograms"][name]
            np.testing.assert_array_equal(h["counts"],
                                          np.histogram(data, np.asarray(h["edges"]))[0])
            np.testing.assert_allclose([h["edges"][0], h["edges"][-1]], [data.min(), data.max()],
                                       rtol=1e-6)

        # Every log-ratio of both devices, the 2.0 in the last bin.
        expected_counts = np.histogram(np.clip(log_ratio, -1, 0.999), np.linspace(-1, 1, 31))[0]
        np.testing.assert_array_equal(result["histograms"]["log_ratio"]["counts"], expected_counts)
