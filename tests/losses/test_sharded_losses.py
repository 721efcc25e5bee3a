"""On 8 fake CPU devices: sharded rewards, GRPO loss and chunked log-probs equal the unsharded results."""

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.losses import grpo_loss, token_logprobs
from searchjax.rewards import RewardConfig, RolloutRecords, compute_rewards
from searchjax.sharding import logical_sharding, make_mesh


def _mesh():
    assert len(jax.devices()) == 8, "tests/conftest.py sets 8 fake CPU devices"
    return make_mesh({"data": 2, "tensor": 4})


def test_compute_rewards_sharded_over_groups():
    mesh = _mesh()
    rng = np.random.default_rng(0)
    n, g = 16, 6
    calls = rng.integers(0, 6, (n, g))
    batch = RolloutRecords(correct=(rng.random((n, g)) < 0.5).astype(np.float32),
                           preference=rng.random((n, g)).astype(np.float32), calls=calls,
                           failures=np.minimum(rng.integers(0, 2, (n, g)), calls),
                           lengths=rng.integers(0, 500, (n, g)).astype(np.float32),
                           ref_lengths=rng.integers(1, 500, (n, g)).astype(np.float32),
                           mask=rng.random((n, g)) < 0.9)
    fn = jax.jit(compute_rewards, static_argnames="cfg")
    key = jax.random.PRNGKey(4)
    want = fn(batch, RewardConfig(), key)
    sharded = jax.device_put(batch, logical_sharding(mesh, ("batch", None)))
    got = fn(sharded, RewardConfig(), key)
    for name in ("reward", "advantages", "tool_penalty", "length_penalty", "tool_baseline"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, atol=1e-7, err_msg=name)


def test_grpo_loss_with_chunked_logprobs_sharded():
    mesh = _mesh()
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    b, t, d, v = 8, 12, 16, 96
    hidden = jax.random.normal(k[0], (b, t, d))
    unembed = jax.random.normal(k[1], (v, d)) / 4
    targets = jax.random.randint(k[2], (b, t), 0, v)
    adv = jax.random.normal(k[3], (b,))
    mask = jnp.ones((b, t), bool).at[:, :3].set(False)

    def loss(h, w):
        logp = token_logprobs(h, w, targets, chunk=32)
        return grpo_loss(logp, jax.lax.stop_gradient(logp) - 0.01, adv, mask, is_cap=1.005)[0]

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    want = step(hidden, unembed)
    got = step(jax.device_put(hidden, logical_sharding(mesh, ("batch", "seq", "embed"))),
               jax.device_put(unembed, logical_sharding(mesh, ("vocab", "embed"))))
    for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-6)
