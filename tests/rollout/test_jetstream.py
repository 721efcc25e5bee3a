"""SearchJaxEngine under JetStream's own orchestrator (in-process) and behind the Decode gRPC service."""

import asyncio
import socket
import threading

import jax
import pytest

from searchjax.rollout import Request, RolloutDriver, Sampling, SearchJaxEngine
from searchjax.rollout.jetstream_compat import engine_api, jetstream_pb2, orchestrator
from searchjax.rollout.serve import RolloutServer, decode, make_driver

TEXTS = ["Paris is the capital of", "The river Avon", "Search the web", "capital of France", "The city", "Bath"]
MAX_TOKENS = 6


def _expected(engine, params, tokenizer, prompts_ids, max_tokens=MAX_TOKENS):
    """What JetStream should return: greedy ids after <|endoftext|> (its BOS), cut before a stop token."""
    drv = RolloutDriver(engine, params)
    bos = tokenizer.special.endoftext
    requests = [
        Request((bos, *ids), max_tokens, jax.random.key(0), Sampling(0.0), stop_token_ids=tokenizer.special.stop_ids, tag=i)
        for i, ids in enumerate(prompts_ids)
    ]
    out = {}
    for c in drv.run(requests):
        ids = c.tokens.tolist()
        out[c.request.tag] = ids[:-1] if c.finish_reason == "stop_token" else ids
    return [out[i] for i in range(len(prompts_ids))]


def test_engine_is_a_jetstream_engine(engine):
    assert isinstance(engine, engine_api.Engine)
    assert engine.max_concurrent_decodes == 4 and engine.samples_per_slot == 1 and engine.max_prefill_length == 64
    tok = engine.build_tokenizer(engine.get_tokenizer())
    ids, true_length = tok.encode("Paris is the capital of", max_prefill_length=64, jax_padding=False)
    assert ids[0] == tok.bos_id and len(ids) == 16 and true_length == 1 + len(engine.tokenizer.encode("Paris is the capital of"))
    assert tok.stop_tokens == set(engine.tokenizer.special.stop_ids)
    sharding = engine.get_prefix_destination_sharding()
    assert all(s.mesh == engine.mesh for s in jax.tree.leaves(sharding))


def test_orchestrator_in_process(engine, params, tokenizer):
    driver = make_driver(engine, engine.load_params())
    servicer = orchestrator.LLMOrchestrator(driver)

    async def one(text):
        request = jetstream_pb2.DecodeRequest(max_tokens=MAX_TOKENS, text_content={"text": text})
        ids, pieces = [], []
        async for response in servicer.Decode(request):
            for sample in response.stream_content.samples:
                ids.extend(sample.token_ids)
                pieces.append(sample.text)
        return ids, "".join(pieces)

    async def all_at_once():  # 6 requests over 4 slots: JetStream's continuous batching
        return await asyncio.gather(*(one(t) for t in TEXTS))

    # The loop must outlive the driver: JetStream's detokenize thread still signals a request's channel
    # (call_soon_threadsafe) after the last response was consumed, and a closed loop there kills the process.
    loop = asyncio.new_event_loop()
    try:
        results = loop.run_until_complete(all_at_once())
    finally:
        driver.stop()
        loop.close()
    want = _expected(engine, params, tokenizer, [tokenizer.encode(t) for t in TEXTS])
    assert [ids for ids, _ in results] == want
    for (ids, text), w in zip(results, want):
        assert len(ids) <= MAX_TOKENS and text == "".join(tokenizer.decode([i]) for i in w)


def test_grpc_round_trip_on_loopback(engine, params, tokenizer):
    server = RolloutServer(engine, host="127.0.0.1", port=0)
    try:
        address = f"127.0.0.1:{server.port}"
        text, ids = decode(address, text=TEXTS[0], max_tokens=MAX_TOKENS)
        prompt = tokenizer.encode(TEXTS[1])
        _, token_ids = decode(address, token_ids=prompt, max_tokens=MAX_TOKENS)
        _assert_not_reachable_off_loopback(server.port)
    finally:
        server.stop()
    want = _expected(engine, params, tokenizer, [tokenizer.encode(TEXTS[0]), prompt])
    assert ids == want[0] and text == "".join(tokenizer.decode([i]) for i in want[0])
    assert token_ids == want[1]


def _assert_not_reachable_off_loopback(port):
    """The service listens on 127.0.0.1 only: the machine's other IPv4 addresses refuse the port."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except socket.gaierror:
        addresses = set()
    for address in addresses - {a for a in addresses if a.startswith("127.")}:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2.0)
            s.connect((address, port))


def test_decode_client_needs_exactly_one_input():
    with pytest.raises(ValueError, match="exactly one"):
        decode("127.0.0.1:1", max_tokens=1)


@pytest.mark.parametrize("bad, match", [
    (dict(max_prefill_length=100), "prefill buckets"),
    (dict(max_concurrent_decodes=0), "max_concurrent_decodes"),
    (dict(max_len=32), "max_len"),
    (dict(max_len=1 << 20, max_prefill_length=64), "max_position_embeddings"),
])
def test_engine_rejects_bad_sizes(cfg, params, tokenizer, bad, match):
    kwargs = dict(max_concurrent_decodes=2, max_prefill_length=64, max_len=256) | bad
    with pytest.raises(ValueError, match=match):
        SearchJaxEngine(cfg, params, tokenizer, **kwargs)


def test_server_survives_bad_requests_and_serves_the_next_good_one(engine, params, tokenizer):
    """Each unservable request gets INVALID_ARGUMENT naming the problem; the process and the server live on."""
    import grpc

    server = RolloutServer(engine, host="127.0.0.1", port=0)
    address = f"127.0.0.1:{server.port}"
    bad = [
        (dict(text="word " * 5000, max_tokens=4), "prefills at most 64"),
        (dict(token_ids=[999999], max_tokens=4), "outside the vocabulary"),
        (dict(token_ids=[-1, 3], max_tokens=4), "outside the vocabulary"),
        (dict(text="", max_tokens=4), "empty"),
        (dict(token_ids=[], max_tokens=4), "empty"),
        (dict(text="Bath", max_tokens=0), "max_tokens must be >= 1"),
    ]
    try:
        for kwargs, match in bad:
            with pytest.raises(grpc.RpcError) as info:
                decode(address, **kwargs)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kwargs
            assert match in info.value.details(), info.value.details()
        _, ids = decode(address, token_ids=tokenizer.encode(TEXTS[1]), max_tokens=MAX_TOKENS)
    finally:
        server.stop()
    assert ids == _expected(engine, params, tokenizer, [tokenizer.encode(TEXTS[1])])[0]


def test_server_rejects_a_port_out_of_range(engine):
    with pytest.raises(ValueError, match="0..65535"):
        RolloutServer(engine, host="127.0.0.1", port=99999)


def test_stop_is_bounded_and_names_what_did_not_stop(engine):
    """A driver whose stop never returns: stop() gives up after its timeout, says so, and answers the same again."""
    import time

    server = RolloutServer(engine, host="127.0.0.1", port=0)
    real_stop, release = server.driver.stop, threading.Event()
    server.driver.stop = release.wait  # blocks until released
    try:
        start = time.perf_counter()
        assert server.stop(timeout_s=0.5) == ["JetStream's driver threads"]
        assert time.perf_counter() - start < 20
        assert server.stop() == ["JetStream's driver threads"]  # the first answer, nothing waited for again
    finally:
        release.set()
        real_stop()
