"""tools/likelihood_prefs.py: the response log-likelihood sums it compares (padding, batching, the mask)."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.losses.logprobs import token_logprobs_from_logits
from searchjax.model import forward
from searchjax.testing.models import tiny_model

_PATH = Path(__file__).resolve().parents[2] / "tools" / "likelihood_prefs.py"
_spec = importlib.util.spec_from_file_location("likelihood_prefs", _PATH)
likelihood_prefs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(likelihood_prefs)


def test_sums_match_each_row_alone_whatever_the_batch_and_padding():
    cfg, params = tiny_model("tiny", seed=3)
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(1, cfg.vocab_size, size=n).tolist()  # noqa: E731
    rows = [(ids(nx), ids(nr)) for nx, nr in [(5, 3), (12, 1), (2, 9), (7, 7), (20, 4)]]

    def logprob_fn(tokens):
        return token_logprobs_from_logits(forward(params, tokens, cfg)[:, :-1], tokens[:, 1:])

    expected = []
    for x, r in rows:  # each row alone, no padding: the response tokens' log-probs given everything before them
        t = jnp.asarray([x + r], jnp.int32)
        logp = np.asarray(logprob_fn(t))[0]
        expected.append(logp[len(x) - 1:].sum())
    got = likelihood_prefs.response_logprob_sums(jax.jit(logprob_fn), rows, widths=[16, 32], batch=2, pad_id=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    assert np.all(got < 0)
