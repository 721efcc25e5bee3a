"""PreferenceScorer (searchjax.rollout.preference): both orders in one jitted call, exact order averaging, length
buckets, agreement with the pure scorer; the loopback HTTP service and its client (dead and slow services)."""

import json
import socket
import time
import urllib.error
import urllib.request

import jax
import numpy as np
import pytest

from searchjax.rewards.reward_model import PairTemplate, PairwiseScorer, PointwiseScorer, Segment, from_policy
from searchjax.rollout.preference import PreferenceScorer, RewardModelClient, RewardModelServer, RewardServiceError
from searchjax.search.http import serving_in_background
from searchjax.testing.models import tiny_model


def char_encode(text: str) -> list[int]:
    """A character-level 'tokenizer' (ids 1..255; the tiny preset's pad id 0 never occurs in text)."""
    return [1 + ord(c) % 255 for c in text]


@pytest.fixture(scope="module")
def model():
    cfg, policy = tiny_model("tiny", seed=0)
    params = from_policy(policy, cfg)
    return cfg, params.replace(head=jax.random.normal(jax.random.key(1), params.head.shape))


BUCKETS = (128, 256, 512)


@pytest.fixture(scope="module", params=["pointwise", "pairwise"])
def scorer(request, model):
    cfg, params = model
    head = PointwiseScorer(cfg) if request.param == "pointwise" else \
        PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))
    return PreferenceScorer(params, head, char_encode, batch_pairs=2, buckets=BUCKETS)


PROMPTS = ["Is the sky blue?", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
           "Name a city in France.", "Which is larger, 3 or 7?", "Say hello."]
ROLLOUTS = ["Yes.", "4", [{"role": "assistant", "content": "Paris is one, and Lyon is another large one."}],
            "7 is larger than 3, by four.", "Hello!"]
REFERENCES = ["No, it is green.", "5", "Berlin.", "3", "Goodbye, and have a long and pleasant day ahead of you."]


def test_order_average_sums_to_one_exactly(scorer):
    p_ab = scorer.score(PROMPTS, ROLLOUTS, REFERENCES)
    p_ba = scorer.score(PROMPTS, REFERENCES, ROLLOUTS)
    assert p_ab.dtype == np.float32 and p_ab.shape == (5,)
    np.testing.assert_array_equal(p_ab + p_ba, np.ones(5, np.float32))
    assert len(set(p_ab.tolist())) == 5  # real scores, not a constant


def test_matches_the_pure_scorer_and_compiles_once_per_bucket(scorer):
    triples = scorer.encode_triples(PROMPTS, ROLLOUTS, REFERENCES)
    got = scorer.score_ids(triples)

    def seg(k):
        rows = [t[k] for t in triples]
        ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return Segment(ids, np.array([len(r) for r in rows], np.int32))

    want = jax.jit(scorer.scorer.preference)(scorer.params, seg(0), seg(1), seg(2))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    widths = {scorer.bucket(max(len(r) for r in scorer.rows(*t)[:2])) for t in triples}
    assert scorer._forward._cache_size() == len(widths) >= 1


def test_position_bias_is_measured_before_averaging(scorer):
    p, d_ab, d_ba = scorer.deltas_ids(scorer.encode_triples(PROMPTS, ROLLOUTS, REFERENCES))
    np.testing.assert_allclose(p, jax.nn.sigmoid(0.5 * (d_ab - d_ba)), rtol=1e-6)
    if scorer.kind == "pointwise":
        np.testing.assert_array_equal(d_ba, -d_ab)
    else:
        assert np.abs(d_ab + d_ba).max() > 1e-4  # a random pairwise head reads the order


def test_a_pair_past_the_largest_bucket_is_refused_first(scorer):
    with pytest.raises(ValueError, match="more than the largest bucket 512"):
        scorer.score(["q"], ["a" * 600], ["b"])
    with pytest.raises(ValueError, match="differ in length"):
        scorer.score(["q"], ["a", "b"], ["c"])
    with pytest.raises(TypeError, match=r"rollouts\[0\]"):
        scorer.score(["q"], [3], ["c"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/score", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_service_scores_like_the_scorer_in_process(scorer):
    with serving_in_background(RewardModelServer(scorer, port=0)) as server:
        client = RewardModelClient(server.url, timeout_s=60)
        np.testing.assert_array_equal(client.score(PROMPTS, ROLLOUTS, REFERENCES),
                                      scorer.score(PROMPTS, ROLLOUTS, REFERENCES))
        with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
            assert json.loads(r.read()) == {"ok": True, "scorer": scorer.kind}
        status, body = post(server.url, {"prompts": ["q"], "rollouts": [[{"role": "bot"}]], "references": ["b"]})
        assert status == 400 and "rollouts[0]" in body["error"]
        status, body = post(server.url, {"prompts": ["q"], "rollouts": ["a"]})
        assert status == 400 and "exactly the fields" in body["error"]
        status, body = post(server.url, {"prompts": ["q"], "rollouts": ["a" * 600], "references": ["b"]})
        assert status == 400 and "largest bucket" in body["error"]
        with pytest.raises(RewardServiceError, match="HTTP 400"):
            client.score(["q"], ["a" * 600], ["b"])


def test_dead_service_is_a_clear_error_after_bounded_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(RewardServiceError, match=rf"{url} failed after 3 attempts .*Connection"):
        RewardModelClient(url, timeout_s=1.0, retries=2, backoff_s=0.01).score(["q"], ["a"], ["b"])
    assert time.monotonic() - start < 5


class SlowScorer(PreferenceScorer):
    def score_ids(self, triples):
        time.sleep(3.0)
        return super().score_ids(triples)


def test_slow_service_is_a_clear_error_not_a_hang(scorer):
    slow = SlowScorer(scorer.params, scorer.scorer, char_encode, batch_pairs=2, buckets=BUCKETS)
    with serving_in_background(RewardModelServer(slow, port=0)) as server:
        start = time.monotonic()
        with pytest.raises(RewardServiceError, match=r"failed after 2 attempts .*timeout 0.5 s each.*timed out"):
            RewardModelClient(server.url, timeout_s=0.5, retries=1, backoff_s=0.01).score(["q"], ["a"], ["b"])
        assert time.monotonic() - start < 3.0
