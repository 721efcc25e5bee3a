"""GRPO step benchmark: the step's time split, rollout tokens/s inside the loop ÷ the bare agent on the same
requests, and the sync's share of the step.

Builds a GRPO run exactly as `searchjax train grpo` does (searchjax.train.grpo.prepare_grpo), then for each of
`--steps` rollout batches:

- bare: the policy agent's rollouts of the batch's prompts with the loop's key, before the step (same weights, same
  keys: the same requests and tokens the loop is about to generate), run once untimed (any new prefill shape
  compiles there, as the loop's reference rollouts compile them for its own rollouts) and then timed alone;
- loop: `GRPOLoop.step` on the same batch: reference rollouts (new prompts only), policy rollouts, rewards and the
  reward model, the train step, the weight sync, each timed by the loop itself.

Step 1 compiles everything and is reported apart; the medians over the remaining steps give the figures.

    JAX_PLATFORMS=cpu python tools/bench_grpo.py --config configs/train/grpo_tiny.yaml --policy DIR \
        --reference DIR --reward-model DIR --prompts qa.jsonl --index DIR [--steps 5] [key.sub=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--config", "--policy", "--reference", "--reward-model", "--index"):
        ap.add_argument(flag, required=flag != "--config")
    ap.add_argument("--prompts", nargs="+", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from searchjax.cli.common import open_search_backend
    from searchjax.train.config import load_train_config
    from searchjax.train.grpo import GRPOConfig, prepare_grpo, with_prompts

    overrides = [f"steps={args.steps}", "save_every=0", "progress=false", *args.overrides]
    cfg = with_prompts(load_train_config(GRPOConfig, args.config, overrides), args.prompts)
    with tempfile.TemporaryDirectory() as out:
        p = prepare_grpo(cfg, args.policy, args.reference, args.reward_model, open_search_backend(args.index), out)
        loop, state = p.loop, p.state
        step_fn = loop.make_step_fn(state)
        source, rows = loop.iterator, []
        for t in range(args.steps):
            batch = next(source)
            prompts = loop.prompts(batch)
            items = [q.item for q in prompts]
            loop.actors.policy.rollouts(items, cfg.rollout.group_size, loop.rollout_key(t))  # compiles new shapes
            t0 = time.perf_counter()
            bare = loop.actors.policy.rollouts(items, cfg.rollout.group_size, loop.rollout_key(t))
            bare_s = time.perf_counter() - t0
            loop.iterator = iter([batch])
            state, m = loop.step(state, step_fn, t)
            tokens = sum(r.response_length for r in bare)
            rows.append({"step": t + 1, "tokens": tokens, "bare_s": bare_s,
                         **{k: v for k, v in m.items() if k.startswith("timing_s/")},
                         "loop_tokens_per_s": m["perf/tokens_per_s"], "bare_tokens_per_s": tokens / bare_s})
            print(json.dumps(rows[-1]), flush=True)
        p.checkpointer.close()
    warm = rows[1:] or rows
    med = lambda k: statistics.median(r[k] for r in warm)  # noqa: E731
    split = {k: med(k) for k in rows[0] if k.startswith("timing_s/")}
    summary = {
        "device": str(jax.devices()[0]), "steps": len(rows), "warm_steps": len(warm),
        "step_split_s": split,
        "loop_tokens_per_s": med("loop_tokens_per_s"), "bare_tokens_per_s": med("bare_tokens_per_s"),
        "loop_over_bare": med("loop_tokens_per_s") / med("bare_tokens_per_s"),
        "sync_share_of_step": split["timing_s/sync"] / split["timing_s/step"],
        "first_step_s": rows[0]["timing_s/step"],
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
