"""Writes tests/fixtures/golden_grpo.npz: GRPO advantages, losses and gradients from an independent torch code.

The torch side is written the way PPO-family trainers (verl / TRL style) write it, not as a transcription of
searchjax.losses: the on-policy ratio is exp(log π − log π.detach()) (value 1, gradient ∇log π) multiplied by
a detached importance weight clamp(π/μ, max=C); the PPO variant uses the usual clipped surrogate with a
detached π_old/μ weight; advantages use torch's population std. Everything runs in float64 and autograd gives
the gradients. The test (tests/losses/test_golden_grpo.py) compares searchjax against this file without torch.

    python tools/golden_grpo.py            # rewrites the fixture
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "golden_grpo.npz"
N, G, T = 3, 4, 9
EPS = 1e-6
CAP = 1.05
CLIP = 0.2


def inputs(seed: int = 20260422) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    group_mask = np.ones((N, G), bool)
    group_mask[2, 3] = False  # one padded rollout
    token_mask = rng.random((N * G, T)) < 0.8
    token_mask[11] = False  # the padded rollout has no tokens
    token_mask[0, :] = True
    logp = -rng.uniform(0.05, 4.0, (N * G, T))
    return {
        "rewards": rng.normal(size=(N, G)).round(3),
        "group_mask": group_mask,
        "token_mask": token_mask,
        "logp": logp,
        "logp_infer": logp + rng.normal(scale=0.08, size=(N * G, T)),
        "logp_old": logp + rng.normal(scale=0.25, size=(N * G, T)),
    }


def advantages(rewards: torch.Tensor, mask: torch.Tensor, normalize_std: bool) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for g in range(rewards.shape[0]):
        r = rewards[g][mask[g]]
        a = r - r.mean()
        if normalize_std:
            a = a / (r.std(unbiased=False) + EPS)
        out[g][mask[g]] = a
    return out


def token_is_loss(logp, logp_infer, adv, mask, cap=None, logp_old=None, clip=None):
    """−(1/B) Σ_i mean_{t∈o_i} [w_{i,t} · surrogate_{i,t}] over rows with tokens."""
    if logp_old is None:
        ratio = torch.exp(logp - logp.detach())  # value 1, gradient ∇log π
        weight = torch.exp(logp.detach() - logp_infer)
        surrogate = ratio * adv[:, None]
    else:
        ratio = torch.exp(logp - logp_old)
        weight = torch.exp(logp_old - logp_infer)
        surrogate = torch.min(ratio * adv[:, None], torch.clamp(ratio, 1 - clip, 1 + clip) * adv[:, None])
    if cap is not None:
        weight = torch.clamp(weight, max=cap)
    per_token = weight.detach() * surrogate
    rows = [per_token[i][mask[i]].mean() for i in range(len(mask)) if mask[i].any()]
    return -torch.stack(rows).mean()


def sequence_is_loss(logp, logp_infer, adv, mask, cap=None):
    """GSPO-style: s_i = exp(mean_t (log π − log μ)), loss = −(1/B) Σ_i s_i Â_i (s_i capped at C, gradient kept)."""
    losses = []
    for i in range(len(mask)):
        if not mask[i].any():
            continue
        s = torch.exp((logp[i][mask[i]] - logp_infer[i][mask[i]]).mean())
        if cap is not None:
            s = s * (torch.clamp(s, max=cap) / s).detach()
        losses.append(s * adv[i])
    return -torch.stack(losses).mean()


def main() -> None:
    data = inputs()
    t = {k: torch.tensor(v) for k, v in data.items()}
    out = dict(data)
    for norm in (True, False):
        out[f"advantages_std{int(norm)}"] = advantages(t["rewards"], t["group_mask"], norm).numpy()
    adv = torch.tensor(out["advantages_std1"]).reshape(-1)
    variants = {
        "plain": lambda x: token_is_loss(x, t["logp_infer"], adv, t["token_mask"]),
        "capped": lambda x: token_is_loss(x, t["logp_infer"], adv, t["token_mask"], cap=CAP),
        "ppo": lambda x: token_is_loss(x, t["logp_infer"], adv, t["token_mask"], cap=CAP, logp_old=t["logp_old"],
                                       clip=CLIP),
        "seq": lambda x: sequence_is_loss(x, t["logp_infer"], adv, t["token_mask"]),
        "seq_capped": lambda x: sequence_is_loss(x, t["logp_infer"], adv, t["token_mask"], cap=CAP),
    }
    for name, fn in variants.items():
        x = t["logp"].clone().requires_grad_(True)
        loss = fn(x)
        loss.backward()
        out[f"loss_{name}"] = np.array(loss.item())
        out[f"grad_{name}"] = x.grad.numpy()
    out["cap"], out["clip"], out["eps"] = np.array(CAP), np.array(CLIP), np.array(EPS)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): " + ", ".join(f"{n}={out['loss_' + n]:.6f}" for n in variants))


if __name__ == "__main__":
    main()
