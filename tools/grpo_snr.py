"""GRPO gradient signal-to-noise: how much of one step's policy gradient is signal, at fixed weights.

Builds a GRPO run exactly as `searchjax train grpo` does (searchjax.train.grpo.prepare_grpo) and, without any
update, draws `--batches` independent rollout batches through the loop's own `GRPOLoop.collect` (its prompts,
reference rollouts, policy rollouts and rewards, with its keys). For each batch k and each advantage variant v it
computes the policy gradient g_k^v = ∇θ L_GRPO at the start weights (the configured loss, router aux term off),
where v is the group-relative advantage of

    R          the configured reward (r_base · s − pen_eff), normalised as configured (rewards.normalize_std)
    R_nostd    the same reward, centred only (Dr. GRPO's advantage)
    r_base     the base reward alone (the verifiable signal), normalised as configured
    pen        −pen_eff alone (the anchored tool and length shaping), normalised as configured

With g_k = s + n_k (s the expected gradient, n_k zero-mean noise, batches independent):
    E⟨g_i, g_j⟩ = ‖s‖² (i ≠ j),   E‖g_k‖² = ‖s‖² + σ²
so signal² = mean of the off-diagonal Gram entries, noise² = mean ‖g_k‖² − signal², and a step of m rollouts
(m = batch_size · group_size here) has signal ≥ noise once it holds m · noise² / signal² rollouts. The standard
error of signal² is the jackknife over batches. Between variants, the signal correlation
    corr(v, w) = mean_{i≠j} ⟨g_i^v, g_j^w⟩ / sqrt(signal²_v · signal²_w)
says how much of the configured direction is the r_base direction and how much the shaping's.

Every batch also reports its mixed groups: those with some of their G rollouts right and some wrong, the only ones
whose r_base advantage is not 0. And which term of R pushes the tool calls: over every group of every batch, the
mean and standard error of cov(Â^term, calls) (searchjax.rewards.calls_covariance: correct, preference, tool,
length and their total; > 0 a policy-gradient step makes more calls likelier, < 0 fewer), overall and by stratum
(QA hop count; the `calls_cov` entry of the report). And which part of the reward model's score moves with the
calls (`rm_logit`): the preference logit Δ̄(x, y_i, y_ref,i) (s = σ(Δ̄)) split into the value head's part and the
likelihood term's β · (ℓ_y − ℓ_ref) (PreferenceScorer.logit_parts), each part's within-group covariance with the
calls (mean ± SE over groups, as above) and its pooled slope per call, Σ_g cov_g / Σ_g var_g(calls): how much one
more search changes the logit in the groups. `--rollouts-only` skips the gradients and reports just these (e.g. to see how the
sampling temperature or G changes them: `rollout.temperature=1.5 rollout.group_size=8`).

    JAX_PLATFORMS=cpu python tools/grpo_snr.py --config configs/train/grpo_science.yaml --policy DIR \
        --reference DIR --reward-model DIR --prompts qa.jsonl rubric.jsonl --index DIR [--batches 16] \
        [--out snr.json] [--rollouts-only] [key.sub=value ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

VARIANTS = ("R", "R_nostd", "r_base", "pen")


def signal_stats(gram: np.ndarray, rollouts: int) -> dict[str, float | None]:
    """signal², noise², its jackknife SE and the rollouts per step for SNR 1 from a K×K Gram matrix of per-batch
    gradients (module docstring). Figures that are 0/0 (a variant whose gradients are all 0, e.g. r_base when no
    group was mixed) are None."""
    k = gram.shape[0]
    off = ~np.eye(k, dtype=bool)
    signal2 = float(gram[off].mean())
    total = float(np.diag(gram).mean())
    jack = [gram[np.ix_(keep, keep)][~np.eye(k - 1, dtype=bool)].mean()
            for keep in (np.arange(k) != drop for drop in range(k))]
    se = float(np.sqrt((k - 1) / k * np.sum((np.asarray(jack) - np.mean(jack)) ** 2)))
    norms = np.sqrt(np.diag(gram))
    pairs = off & (np.outer(norms, norms) > 0)
    cos = gram[pairs] / np.outer(norms, norms)[pairs]
    return {"signal2": signal2, "signal2_se": se, "noise2": total - signal2,
            "signal_share": signal2 / total if total > 0 else None,
            "mean_cos_between_batches": float(cos.mean()) if cos.size else None,
            "rollouts_for_snr_1": rollouts * (total - signal2) / signal2 if signal2 > 0 else None}


def calls_summary(covs: list[dict[str, np.ndarray]], strata: list[str]) -> dict[str, dict[str, float]]:
    """{"all" | stratum: {term: mean, term_se: its standard error, groups: n}} of the per-group covariances of
    every batch (`covs`: one dict of [N] arrays per batch; `strata`: each group's stratum, in the same order)."""
    per = {k: np.concatenate([c[k] for c in covs]) for k in covs[0]}
    names = np.asarray(strata)
    out = {}
    for label, keep in [("all", np.ones(len(names), bool)), *((s, names == s) for s in sorted(set(strata)))]:
        n = int(keep.sum())
        out[label] = {"groups": n}
        for k, v in per.items():
            out[label][k] = float(v[keep].mean())
            out[label][f"{k}_se"] = float(v[keep].std(ddof=1) / np.sqrt(n)) if n > 1 else None
    return out


def per_call_slopes(covs: list[dict[str, np.ndarray]], var_calls: list[np.ndarray],
                    strata: list[str]) -> dict[str, dict[str, float | None]]:
    """{"all" | stratum: {part: Σ_g cov_g / Σ_g var_g(calls)}}: the pooled within-group regression slope of each
    part on the tool calls (None where no group's calls vary)."""
    per = {k: np.concatenate([c[k] for c in covs]) for k in covs[0]}
    var, names = np.concatenate(var_calls), np.asarray(strata)
    out = {}
    for label, keep in [("all", np.ones(len(names), bool)), *((s, names == s) for s in sorted(set(strata)))]:
        den = float(var[keep].sum())
        out[label] = {k: float(v[keep].sum()) / den if den > 0 else None for k, v in per.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--config", "--policy", "--reference", "--reward-model", "--index"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--prompts", nargs="+", required=True)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--rollouts-only", action="store_true",
                    help="no gradients: per batch only the base reward and how many groups are mixed (some of "
                         "their G rollouts right, some wrong: the groups whose r_base advantage is not 0)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.batches < 3:
        ap.error(f"--batches: at least 3 for a jackknife of the off-diagonal mean, got {args.batches}")

    from jax.flatten_util import ravel_pytree

    from searchjax.cli.common import open_search_backend
    from searchjax.losses.advantages import group_advantages
    from searchjax.train.config import load_train_config
    from searchjax.rewards import calls_covariance, group_covariance
    from searchjax.train.grpo import GRPOConfig, mixed_groups, prepare_grpo, prompt_strata, with_prompts
    from searchjax.train.rl import grpo_loss_fn, train_arrays
    from searchjax.train.step import device_batch

    overrides = [f"steps={args.batches}", "save_every=0", "progress=false", *args.overrides]
    cfg = with_prompts(load_train_config(GRPOConfig, args.config, overrides), args.prompts)
    rc = cfg.rewards
    grads: dict[str, list[np.ndarray]] = {v: [] for v in VARIANTS}
    rows, covs, strata, logit_covs, var_calls = [], [], [], [], []
    with tempfile.TemporaryDirectory() as out:
        p = prepare_grpo(cfg, args.policy, args.reference, args.reward_model, open_search_backend(args.index), out)
        loop, params = p.loop, p.state.params
        loss_fn = grpo_loss_fn(p.start.cfg, rc, temperature=cfg.rollout.temperature, chunk=cfg.loss_chunk,
                               aux_coef=0.0, remat=cfg.remat)
        grad_fn = jax.jit(jax.grad(lambda prm, batch: loss_fn(prm, batch, None)[0]))
        g = cfg.rollout.group_size
        for t in range(args.batches):
            t0 = time.perf_counter()
            prompts = loop.prompts(next(loop.iterator))
            groups, br, r_base, _, _ = loop.collect(prompts, t)
            mask = jnp.asarray(br.mask)
            norm = dict(normalize_std=rc.normalize_std, eps=rc.adv_eps)
            adv = {} if args.rollouts_only else {
                "R": br.advantages,
                "R_nostd": group_advantages(br.reward, mask, normalize_std=False, eps=rc.adv_eps),
                "r_base": group_advantages(jnp.asarray(r_base), mask, **norm),
                "pen": group_advantages(-br.efficiency_penalty, mask, **norm)}
            for v in adv:
                arrays = train_arrays(groups.flat(), np.asarray(adv[v]).reshape(-1), pad_id=loop.pad_id,
                                      buckets=cfg.data.buckets)
                flat, _ = ravel_pytree(grad_fn(params, device_batch(arrays, loop.mesh)))
                grads[v].append(np.asarray(flat, np.float32))
            calls = groups.field("tool_calls")
            covs.append({k: np.asarray(v) for k, v in calls_covariance(br, calls, rc).items()})
            scorer = loop.actors.scorer  # the reward model's logit on the same triples, in its two parts
            parts = scorer.logit_parts(loop.actors.inputs.triples(prompts, groups.grid, loop.cache,
                                                                  scorer.needs_masks))
            logit_covs.append({k: np.asarray(group_covariance(v.reshape(len(prompts), g), calls, mask))
                               for k, v in parts.items()})
            var_calls.append(np.asarray(group_covariance(calls, calls, mask)))
            strata.extend(prompt_strata(prompts))
            rows.append({"batch": t + 1, "r_base": float(np.mean(r_base)),
                         "mixed_groups": int(mixed_groups(r_base).sum()),
                         "groups": len(prompts), "s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
        p.checkpointer.close()
    rollouts = cfg.batch_size * g
    mixed = sum(r["mixed_groups"] for r in rows)
    summary = {"config": args.config, "overrides": args.overrides, "batches": args.batches,
               "rollouts_per_batch": rollouts, "per_batch": rows, "r_base": float(np.mean([r["r_base"] for r in rows])),
               "mixed_groups": mixed, "groups": sum(r["groups"] for r in rows),
               "calls_cov": calls_summary(covs, strata),
               "rm_logit": {"calls_cov": calls_summary(logit_covs, strata),
                            "per_call": per_call_slopes(logit_covs, var_calls, strata)}}
    if args.rollouts_only:
        return _write(summary, args.out)
    mats = {v: np.stack(grads[v]).astype(np.float64) for v in VARIANTS}
    result = {**summary, "parameters": int(mats["R"].shape[1]),
              "variants": {v: signal_stats(m @ m.T, rollouts) for v, m in mats.items()}, "signal_corr": {}}
    off = ~np.eye(args.batches, dtype=bool)
    for v, w in itertools.combinations(VARIANTS, 2):
        cross = (mats[v] @ mats[w].T)[off].mean()
        sv, sw = result["variants"][v]["signal2"], result["variants"][w]["signal2"]
        result["signal_corr"][f"{v}~{w}"] = float(cross / np.sqrt(sv * sw)) if sv > 0 and sw > 0 else None
    _write(result, args.out)


def _write(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        from searchjax.atomic import atomic_write_text
        atomic_write_text(out, text + "\n")


if __name__ == "__main__":
    main()
