"""searchjax GRPO advantages, losses and gradients vs the committed fixture of an independent torch code.

The fixture comes from tools/golden_grpo.py (torch, float64); this test does not import torch.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.losses import group_advantages, grpo_loss, sequence_grpo_loss

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "golden_grpo.npz"


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(FIXTURE))


@pytest.mark.parametrize("normalize", [True, False])
def test_advantages(golden, normalize):
    adv = group_advantages(jnp.asarray(golden["rewards"], jnp.float32), jnp.asarray(golden["group_mask"]),
                           normalize_std=normalize, eps=float(golden["eps"]))
    np.testing.assert_allclose(adv, golden[f"advantages_std{int(normalize)}"], rtol=1e-5, atol=1e-6)


VARIANTS = {
    "plain": lambda g, x, a: grpo_loss(x, g["logp_infer"], a, g["token_mask"]),
    "capped": lambda g, x, a: grpo_loss(x, g["logp_infer"], a, g["token_mask"], is_cap=float(g["cap"])),
    "ppo": lambda g, x, a: grpo_loss(x, g["logp_infer"], a, g["token_mask"], is_cap=float(g["cap"]),
                                     clip_eps=float(g["clip"]), logp_old=g["logp_old"]),
    "seq": lambda g, x, a: sequence_grpo_loss(x, g["logp_infer"], a, g["token_mask"]),
    "seq_capped": lambda g, x, a: sequence_grpo_loss(x, g["logp_infer"], a, g["token_mask"], is_cap=float(g["cap"])),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("use_jit", [False, True])
def test_loss_and_gradient(golden, name, use_jit):
    g = {k: jnp.asarray(v, jnp.float32) if v.dtype == np.float64 else jnp.asarray(v) for k, v in golden.items()}
    adv = g["advantages_std1"].reshape(-1)
    fn = jax.value_and_grad(lambda x: VARIANTS[name](g, x, adv)[0])
    loss, grad = (jax.jit(fn) if use_jit else fn)(g["logp"])
    np.testing.assert_allclose(loss, golden[f"loss_{name}"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, golden[f"grad_{name}"], rtol=1e-5, atol=1e-7)
