"""How much a checkpoint copies from its context: the induction probe behind RESULTS.md's "what limits it".

A sequence of L tokens followed by the same L tokens again: a model that can copy predicts the second copy far
better than the first (an induction mechanism: find the earlier occurrence of the current token, predict what
followed it). For each of N sequences, two kinds:

- corpus:  L consecutive tokens of a random corpus document window (natural text the model was trained on);
- random:  L uniformly random token ids (nothing to predict except by copying).

Reported, in nats per token over positions 8..L-1 of each half (the first few tokens of the second copy are left
out: the model needs a token or two to find where it is):

    nll_first, nll_second   mean next-token NLL on the first and on the second copy
    copy_gain = nll_first − nll_second   (≈ 0: no copying; ≈ nll_first: perfect copying)

    JAX_PLATFORMS=cpu python tools/copy_probe.py --model DIR [DIR ...] --corpus world/corpus.jsonl \
        [--length 128] [--n 16] [--seed 0]

Prints one JSON object per model.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.chat import load_tokenizer
from searchjax.data.lm import token_stream
from searchjax.model import forward, load_hf

SKIP = 8


def probe_sequences(stream: np.ndarray, vocab: int, length: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """int32 [n, 2·length] sequences x ‖ x, for corpus windows and for random ids (module docstring)."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - length, size=n)
    corpus = np.stack([stream[s: s + length] for s in starts])
    random = rng.integers(0, vocab, size=(n, length), dtype=np.int64).astype(np.int32)
    return {k: np.concatenate([x, x], axis=1).astype(np.int32) for k, x in (("corpus", corpus), ("random", random))}


def halves_nll(logits: jax.Array, tokens: jax.Array, length: int) -> tuple[float, float]:
    """Mean NLL of next-token predictions inside the first and the second copy (positions SKIP..length-1 of
    each)."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]  # nll[:, t] predicts tokens[:, t + 1]
    first = nll[:, SKIP - 1: length - 1]
    second = nll[:, length + SKIP - 1: 2 * length - 1]
    return float(first.mean()), float(second.mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", required=True, help="HF checkpoint directories (with tokenizer.json)")
    ap.add_argument("--corpus", required=True, help="corpus JSONL the windows are drawn from")
    ap.add_argument("--length", type=int, default=128, help="tokens per copy (L)")
    ap.add_argument("--n", type=int, default=16, help="sequences per kind")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.length <= 2 * SKIP:
        ap.error(f"--length must be > {2 * SKIP}")
    for path in args.model:
        cfg, params = load_hf(path, dtype="float32")
        tok = load_tokenizer(f"{path}/tokenizer.json")
        seqs = probe_sequences(token_stream([args.corpus], tok), cfg.vocab_size, args.length, args.n, args.seed)
        fwd = jax.jit(lambda p, t: forward(p, t, cfg))
        out = {"model": path, "length": args.length, "n": args.n}
        for kind, x in seqs.items():
            t = jnp.asarray(x)
            a, b = halves_nll(fwd(params, t), t, args.length)
            out[kind] = {"nll_first": round(a, 4), "nll_second": round(b, 4), "copy_gain": round(a - b, 4)}
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
