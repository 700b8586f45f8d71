"""Data parallelism on one machine's devices: the environments split along a mesh's "envs" axis,
everything else replicated, and an optimizer that steps with the devices' mean gradient. Each
script says which of its state is split (its specs) and runs its one-device update under
`jax.shard_map`; nothing here changes what the update computes."""

import jax
import jax.flatten_util
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "envs"


def make_mesh(num_devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:num_devices]), (AXIS,))


def shardings(mesh: Mesh, specs):
    """The NamedShardings of a pytree of PartitionSpecs."""
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=is_spec)


def with_mean_gradient(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer`, stepping with the mean of the devices' gradients (one collective for the whole
    gradient), so that every device takes the same step and the parameters stay replicated."""
    def update(grads, state, params=None):
        flat, unravel = jax.flatten_util.ravel_pytree(grads)
        return optimizer.update(unravel(jax.lax.pmean(flat, AXIS)), state, params)

    return optax.GradientTransformation(optimizer.init, update)
