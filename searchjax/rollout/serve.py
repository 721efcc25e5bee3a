"""JetStream's orchestrator and gRPC service with `SearchJaxEngine`, bound to 127.0.0.1 unless told otherwise.

JetStream 0.2.2's `server_lib.run` always binds every interface ("[::]"). We run the same pieces ourselves: its
`orchestrator.Driver` (interleaved mode: one engine does prefill and generate with one params tree) and its
`LLMOrchestrator` servicer (the Decode and HealthCheck RPCs, text or token inputs), on a `grpc.aio` server
bound to the host we are given.

JetStream's driver threads kill the whole process when a prefill raises, so every Decode request is checked
first (`request_problem`): an empty prompt, a prompt longer than the engine's prefill length, token ids outside
the vocabulary, `max_tokens` < 1 or a `session_cache` (not supported) get an INVALID_ARGUMENT reply naming what
is wrong, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc

from searchjax.rollout.engine import SearchJaxEngine
from searchjax.rollout.jetstream_compat import jetstream_pb2, jetstream_pb2_grpc, orchestrator

STOP_TIMEOUT_S = 30.0  # RolloutServer.stop: the longest wait for each part of the server to stop


def request_problem(request: "jetstream_pb2.DecodeRequest", engine: SearchJaxEngine) -> str | None:
    """What makes `request` unservable by `engine`, in one line; None when it can be served."""
    if request.max_tokens < 1:
        return f"max_tokens must be >= 1, got {request.max_tokens}"
    if request.session_cache:
        return "session_cache is not supported by this server; send the whole prompt"
    which = request.WhichOneof("content")
    if which is None:
        return "the request has no prompt: set text_content or token_content"
    vocab = engine.tokenizer.vocab_size
    if which == "text_content":
        if not request.text_content.text:
            return "text_content.text is empty"
        n = len(engine.tokenizer.encode(request.text_content.text))
    else:
        ids = request.token_content.token_ids
        if not ids:
            return "token_content.token_ids is empty"
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            return f"token_content.token_ids: {len(bad)} ids outside the vocabulary [0, {vocab}), e.g. {bad[0]}"
        n = len(ids)
    # JetStream prepends <|endoftext|> (its BOS) and prefills the prompt in one call of at most this length.
    if 1 + n > engine.max_prefill_length:
        return (f"the prompt has {n} tokens (+1 BOS); this server prefills at most {engine.max_prefill_length} "
                "(its --max-prefill-length)")
    return None


class ValidatingOrchestrator(orchestrator.LLMOrchestrator):
    """JetStream's servicer, answering INVALID_ARGUMENT to a request the engine cannot serve instead of handing
    it to the driver threads (where the failure would end the process)."""

    def __init__(self, driver: "orchestrator.Driver", engine: SearchJaxEngine):
        super().__init__(driver)
        self._engine = engine

    async def Decode(self, request, context=None):  # noqa: N802 - gRPC's naming
        problem = request_problem(request, self._engine)
        if problem is not None:
            if context is None:  # JetStream's offline (in-process) mode
                raise ValueError(problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        async for response in super().Decode(request, context):
            yield response


def make_driver(engine: SearchJaxEngine, params=None) -> "orchestrator.Driver":
    """JetStream's Driver over one engine in interleaved mode (its threads start immediately)."""
    params = engine.load_params() if params is None else params
    return orchestrator.Driver(
        prefill_engines=[engine], generate_engines=[engine], prefill_params=[params], generate_params=[params],
        interleaved_mode=True,
    )


class RolloutServer:
    """The Decode gRPC service on `host:port` (port 0 picks a free one; `.port` is the bound port)."""

    def __init__(self, engine: SearchJaxEngine, host: str = "127.0.0.1", port: int = 0, threads: int | None = None):
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 picks a free one), got {port}")
        self.driver = make_driver(engine)
        self._stuck: list[str] | None = None  # set by the first stop()
        self._executor = futures.ThreadPoolExecutor(max_workers=threads or max(engine.max_concurrent_decodes, 8))
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(self._executor)
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._thread.start()

        async def build():
            server = grpc.aio.server(self._executor)
            jetstream_pb2_grpc.add_OrchestratorServicer_to_server(ValidatingOrchestrator(self.driver, engine), server)
            bound = server.add_insecure_port(f"{host}:{port}")
            if bound == 0:
                raise OSError(f"could not bind the gRPC server to {host}:{port}")
            await server.start()
            return server, bound

        try:
            self._server, self.port = self._run(build())
        except BaseException:
            self._shutdown_threads()
            raise
        self.host = host

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _shutdown_threads(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        stuck = [] if _bounded(self.driver.stop, timeout_s) else ["JetStream's driver threads"]
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            stuck.append("the gRPC event loop")
        if not _bounded(lambda: self._executor.shutdown(wait=True, cancel_futures=True), timeout_s):
            stuck.append("the RPC worker threads")
        return stuck

    def wait_for_termination(self) -> None:
        try:
            self._run(self._server.wait_for_termination())
        finally:
            self.stop()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop the RPCs, then JetStream's driver threads, the event loop and the RPC workers, each waited for at
        most `timeout_s`. Returns what did not stop in time (empty: a clean stop); a second call returns the
        first one's answer. JetStream's `Driver.stop` loops until every thread has taken a sentinel, which once
        took over 60 s beside the test suite on the 2-core machine (session 7). The caller decides whether to exit
        past what is stuck (`searchjax serve` does)."""
        if self._stuck is None:
            self._stuck = []
            try:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace=1.0), self._loop).result(timeout_s)
            except futures.TimeoutError:
                self._stuck.append("the gRPC server")
            self._stuck += self._shutdown_threads(timeout_s)
        return self._stuck


def _bounded(fn, timeout_s: float) -> bool:
    """Call fn() in a daemon thread; whether it returned (or raised) within timeout_s."""
    done = threading.Event()

    def target():
        try:
            fn()
        finally:
            done.set()

    threading.Thread(target=target, name="bounded-stop", daemon=True).start()
    return done.wait(timeout_s)


def decode(address: str, *, text: str | None = None, token_ids: list[int] | None = None, max_tokens: int,
           timeout_s: float = 120.0) -> tuple[str, list[int]]:
    """A blocking Decode RPC client: (text, token ids) of the whole streamed answer."""
    if (text is None) == (token_ids is None):
        raise ValueError("decode: give exactly one of text or token_ids")
    if text is not None:
        request = jetstream_pb2.DecodeRequest(max_tokens=max_tokens, text_content={"text": text})
    else:
        request = jetstream_pb2.DecodeRequest(max_tokens=max_tokens, token_content={"token_ids": token_ids})
    pieces, ids = [], []
    with grpc.insecure_channel(address) as channel:
        stub = jetstream_pb2_grpc.OrchestratorStub(channel)
        for response in stub.Decode(request, timeout=timeout_s):
            for sample in response.stream_content.samples:
                pieces.append(sample.text)
                ids.extend(sample.token_ids)
    return "".join(pieces), ids
