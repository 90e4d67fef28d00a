"""The gateway's HTTP application: OpenAI-compatible chat completions in front of Triton.

Every call, answered or failed, becomes a ``chat`` span on Kafka that joins the
caller's trace (W3C ``traceparent``), carrying what training needs: messages,
token ids, logprobs and the Triton version that answered. Its response id carries
the trace id, so that ``POST /v1/feedback`` on that id later lands in the same
trace (see :mod:`spanmill.feedback`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.background import BackgroundTask

from spanmill import feedback
from spanmill import messages as chat
from spanmill.bodylimit import BodyLimit, Limit, Scope, header
from spanmill.config import GatewaySettings
from spanmill.errors import ConfigError
from spanmill.gateway.configmap import ConfigMapRoutes, RoutingSource, routing_source
from spanmill.gateway.emitter import EmitterBusy, SpanEmitter
from spanmill.gateway.limits import KeyLimits, Refusal
from spanmill.gateway.llm_span import build_llm_span, new_span_id, new_trace_id
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.gateway.routing import RoutingTable
from spanmill.gateway.schema import ChatCompletionRequest, error_body
from spanmill.gateway.upstream import Target, TritonUpstream, Upstream, UpstreamError
from spanmill.keys import ADMIN, ANONYMOUS, KeyRing, bearer
from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams, GenerationResult, ProtocolError
from spanmill.spans import Span

log = logging.getLogger(__name__)
T = TypeVar("T")
_propagator = TraceContextTextMapPropagator()
SERVICE_NAME = "spanmill-gateway"
# The metrics' model label of a call to no routed model: a client's model string is never
# a label of its own (each would be a series held for good, whatever its size).
UNROUTED = "(unrouted)"
FEEDBACK = "/v1/feedback"


@dataclass
class GatewayState:
    settings: GatewaySettings
    upstream: Upstream
    emitter: SpanEmitter
    metrics: GatewayMetrics
    routing_file: RoutingSource | None
    table: RoutingTable = field(default_factory=RoutingTable)
    rng: random.Random = field(default_factory=random.Random)
    limits: KeyLimits = field(default_factory=KeyLimits)

    def routes(self) -> RoutingTable:
        if self.routing_file is not None:
            self.table = self.routing_file.current()
        self.metrics.routing_revision.set(self.table.revision)
        return self.table


def _caller_context(request: Request) -> tuple[str, str | None]:
    """The caller's trace id and span id from ``traceparent``, or a fresh trace."""
    if b"traceparent" not in (name for name, _ in request.scope["headers"]):
        return new_trace_id(), None
    context = _propagator.extract(carrier=dict(request.headers))
    span_context = trace.get_current_span(context).get_span_context()
    if span_context.is_valid:
        return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"
    return new_trace_id(), None


def _invalid(errors: Sequence[Any]) -> JSONResponse:
    """400 naming each field a body got wrong (the whole body where it is not JSON)."""
    problems = []
    for error in errors:
        json_error = error["type"] == "json_invalid"  # its place is a position in the bytes
        where = "" if json_error else ".".join(str(p) for p in error["loc"] if p != "body")
        problems.append(f"{where}: {error['msg']}" if where else error["msg"])
    return _error(400, f"invalid request: {'; '.join(problems)}", "invalid_request_error")


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status_code=status)


def _caller(request: Request) -> feedback.Caller:
    """Who sent a request, as the ``authorize`` middleware found it."""
    principal = getattr(request.state, "principal", "anonymous")
    address = request.client.host if request.client is not None else None
    return feedback.Caller(principal=principal, address=address)


class _Authorize:
    """Who calls, as a plain ASGI middleware (Starlette's ``BaseHTTPMiddleware`` costs a task
    and a stream copy per request): the id of the client key presented, ``admin`` on the
    admin routes, ``anonymous`` where no key is asked. It goes into the request's state."""

    OPEN = ("/healthz", "/readyz", "/metrics")

    def __init__(self, app: Any, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            state = scope.setdefault("state", {})
            state["principal"] = ANONYMOUS
            path = scope["path"]
            if not path.startswith(self.OPEN):
                token = bearer(header(scope, b"authorization"))
                refused = None
                if path.startswith("/admin"):
                    if self.keys.admin_configured:
                        if token is None or not self.keys.is_admin(token):
                            refused = _error(401, "missing or wrong admin token",
                                             "authentication_error")  # fmt: skip
                        else:
                            state["principal"] = ADMIN
                    elif self.keys.required:
                        refused = _error(
                            403,
                            "the admin routes need their own credential, and none is set "
                            "(SPANMILL_GATEWAY_ADMIN_API_KEY)",
                            "permission_error",
                        )
                elif self.keys.required:
                    key_id = self.keys.identify(token) if token is not None else None
                    if key_id is None:
                        refused = _error(401, "missing or unknown API key", "authentication_error")
                    else:
                        state["principal"] = key_id
                if refused is not None:
                    await refused(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def create_app(
    settings: GatewaySettings,
    *,
    emitter: SpanEmitter | None = None,
    upstream: Upstream | None = None,
    table: RoutingTable | None = None,
) -> FastAPI:
    metrics = GatewayMetrics()
    state = GatewayState(
        settings=settings,
        upstream=upstream
        or TritonUpstream(
            settings.triton.http_url,
            # Past the gateway's own deadline, which answers 504 and stops the generation.
            timeout_s=settings.request_timeout_s + 30,
            on_retry=metrics.retries.inc,
        ),
        emitter=emitter
        or SpanEmitter(settings.kafka, metrics, settings.span_queue_size, settings.span_outage_s),
        metrics=metrics,
        routing_file=routing_source(settings.routing_file, settings.routing_configmap),
        table=table or RoutingTable(),
        limits=KeyLimits(
            requests_per_s=settings.key_requests_per_s,
            burst=settings.key_burst,
            max_concurrent=settings.key_max_concurrent,
        ),
    )
    state.emitter.metrics = metrics

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.emitter.start()
        yield
        state.emitter.close()
        if isinstance(state.routing_file, ConfigMapRoutes):
            state.routing_file.close()
        await state.upstream.close()

    app = FastAPI(title="spanmill gateway", lifespan=lifespan)
    app.state.gateway = state

    # Feedback has its own limit, as at the collector's receiver (the gateway's where
    # that is lower), enforced here before its body is read, chunked or declared.
    def too_large(scope: Scope, limit: int) -> JSONResponse:
        return _error(
            413, f"the request body is over the limit of {limit} bytes", "invalid_request_error"
        )

    def feedback_too_large(scope: Scope, limit: int) -> JSONResponse:
        metrics.feedback.labels("rejected").inc()
        if limit != feedback.MAX_BODY_BYTES:
            return too_large(scope, limit)
        error = feedback.too_large()
        return JSONResponse(error.body(), status_code=error.status)

    feedback_bytes = min(settings.max_request_bytes, feedback.MAX_BODY_BYTES)
    app.add_middleware(
        BodyLimit,
        limits={FEEDBACK: Limit(feedback_bytes, feedback_too_large)},
        default=Limit(settings.max_request_bytes, too_large),
    )
    keys = KeyRing(settings.client_keys_file, settings.api_key, settings.admin_api_key)
    app.add_middleware(_Authorize, keys=keys)

    # First of the app's routes, as the one nearly every request takes: routes are
    # matched in order. The body is parsed and checked by pydantic straight from its
    # bytes: FastAPI's own handling of a body parameter (json.loads, then dependency
    # solving and validation) cost more than a tenth of the gateway's work on a
    # request. The schema is declared for the OpenAPI document.
    @app.post(
        "/v1/chat/completions",
        response_model=None,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": ChatCompletionRequest.model_json_schema()}}}},
    )  # fmt: skip
    async def chat_completions(request: Request) -> Response:
        try:
            body = ChatCompletionRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return _invalid(exc.errors())
        return await _complete(state, body, request)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid(exc.errors())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        if await state.upstream.ready():
            return JSONResponse({"status": "ready"})
        return _error(503, f"Triton at {state.upstream.url} is not ready", "unavailable")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "spanmill"}
                for name in sorted(state.routes().routes)
            ],
        }

    @app.get("/admin/routes")
    async def get_routes() -> JSONResponse:
        return JSONResponse(json.loads(state.routes().dumps()))

    @app.put("/admin/routes")
    async def put_routes(request: Request) -> JSONResponse:
        try:
            table = RoutingTable.parse(await request.body(), "request body")
        except ConfigError as exc:
            return _error(400, str(exc), "invalid_request_error")
        if state.routing_file is not None:
            try:  # a file, or the Kubernetes API: off the event loop, which serves calls
                await asyncio.to_thread(state.routing_file.write, table)
            except Exception as exc:
                log.warning("routing revision %s not stored: %s", table.revision, exc)
                return _error(503, f"the routing table was not stored: {exc}", "unavailable")
        state.table = table
        return JSONResponse({"revision": table.revision})

    @app.post(FEEDBACK)
    async def post_feedback(request: Request) -> JSONResponse:
        return await _feedback(state, request)

    return app


async def _feedback(state: GatewayState, request: Request) -> JSONResponse:
    """Feedback items as reward spans, within the caller's limits as its calls are
    (:mod:`spanmill.gateway.limits`); answered once Kafka acknowledged every one. Its
    body is at most feedback's limit (``BodyLimit``)."""
    if not state.limits.active:
        return await _feedback_items(state, request)
    key = getattr(request.state, "principal", ANONYMOUS)
    refusal = state.limits.admit(key)
    if refusal is not None:
        state.metrics.feedback.labels("rejected").inc()
        return _over_limit(refusal)
    try:
        return await _feedback_items(state, request)
    finally:
        state.limits.done(key)


async def _feedback_items(state: GatewayState, request: Request) -> JSONResponse:
    try:
        items = feedback.parse_feedback_body(await request.body())
    except feedback.FeedbackError as exc:
        state.metrics.feedback.labels("rejected").inc()
        return JSONResponse(exc.body(), status_code=exc.status)
    caller = _caller(request)
    received = time.time_ns()
    spans = [
        feedback.feedback_span(item, caller, received, new_span_id(), service_name=SERVICE_NAME)
        for item in items
    ]
    try:
        outcome = await state.emitter.deliver(spans)
    except EmitterBusy as exc:
        reply = feedback.busy(str(exc))
    else:
        reply = feedback.answer(spans, outcome)
    accepted = len(spans) if reply.status == 200 else len(reply.body["delivered"])
    state.metrics.feedback.labels("accepted").inc(accepted)
    state.metrics.feedback.labels("unavailable").inc(len(spans) - accepted)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)


@dataclass
class _Call:
    """One chat completion on its way: what its spans, metrics and chunks are made of."""

    state: GatewayState
    body: ChatCompletionRequest
    triton_model: str
    version: str
    response_id: str
    span_facts: dict[str, Any]
    started_ns: int
    clock: float
    # The whole answer, its choices and when it ended: its spans are built and handed
    # to the emitter once the response has left (flush).
    answer: tuple[GenerationResult, list[dict[str, Any]], int] | None = None
    # The first choice's span, named in the response's traceresponse header.
    span_id: str = field(default_factory=new_span_id)

    def _span_id(self, index: int = 0) -> str:
        return self.span_id if index == 0 else new_span_id()

    def failed(self, error: str, status: int) -> None:
        self.state.metrics.requests.labels(self.body.model, self.version, str(status)).inc()
        self._emit(partial(
            build_llm_span, **self.span_facts, span_id=self.span_id, end_ns=time.time_ns(),
            response_id=None, error=error, error_type=str(status),
        ))  # fmt: skip

    def _emit(self, build: Callable[[], Span]) -> None:
        """Hand a span to the emitter; one the call's content cannot make (a value no
        span can hold) is counted as dropped and logged, never raised: its answer is,
        or is about to be, on its way to the client."""
        try:
            span = build()
        except Exception:
            log.exception("the LLM span of %s could not be built", self.response_id)
            self.state.metrics.spans_dropped.labels("unbuildable").inc()
            return
        self.state.emitter.emit(span)

    def answered(self, result: GenerationResult) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The choices of a whole answer and its usage, with its metrics recorded; its
        spans wait for :meth:`flush`."""
        choices = list(_choices(result, tools_offered=bool(self.body.tools)))
        self.answer = (result, choices, time.time_ns())
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        model, version, metrics = self.body.model, self.version, self.state.metrics
        metrics.requests.labels(model, version, "200").inc()
        metrics.latency.labels(model, version).observe(time.perf_counter() - self.clock)
        metrics.completion_tokens.labels(model, version).inc(completion_tokens)
        prompt_tokens = len(result.prompt_token_ids)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return choices, usage

    def flush(self) -> None:
        """Build the answer's spans and hand them to the emitter. Called once the
        response has left: building, encoding and sending them then never delay it."""
        if self.answer is None:
            return
        result, choices, ended = self.answer
        self.answer = None
        for index, choice in enumerate(choices):
            self._emit(partial(
                build_llm_span, **self.span_facts, span_id=self._span_id(index), end_ns=ended,
                response_id=self.response_id, choice=choice,
                prompt_token_ids=result.prompt_token_ids,
                token_ids_source=result.extra.get("token_ids"),
            ))  # fmt: skip

    def head(self, result: GenerationResult | None = None) -> dict[str, Any]:
        served = result.model_version if result is not None and result.model_version else None
        return {
            "id": self.response_id,
            "created": self.started_ns // 1_000_000_000,
            "model": self.body.model,
            "system_fingerprint": f"{self.triton_model}:{served or self.version}",
        }


async def _complete(state: GatewayState, body: ChatCompletionRequest, request: Request) -> Response:
    """One chat completion, within its client's limits (see :mod:`spanmill.gateway.limits`)."""
    if not state.limits.active:
        return await _answer(state, body, request, lambda: None)
    key = getattr(request.state, "principal", ANONYMOUS)
    refusal = state.limits.admit(key)
    if refusal is not None:
        state.metrics.requests.labels(_model_label(state, body.model), "", "429").inc()
        return _over_limit(refusal)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.limits.done(key)

    try:
        response = await _answer(state, body, request, release)
    except BaseException:
        release()
        raise
    if not isinstance(response, StreamingResponse):
        release()
    return response


def _over_limit(refusal: Refusal) -> JSONResponse:
    """429 with when to come back, for a call or feedback past its key's limits."""
    refused = _error(429, refusal.message, "rate_limit_exceeded")
    refused.headers["retry-after"] = str(refusal.retry_after_s)
    return refused


def _model_label(state: GatewayState, model: str) -> str:
    return model if model in state.routes().routes else UNROUTED


async def _answer(
    state: GatewayState,
    body: ChatCompletionRequest,
    request: Request,
    release: Callable[[], None],
) -> Response:
    """The completion itself; ``release`` ends the client's request slot, which a streamed
    answer keeps until its stream ends."""
    started = time.time_ns()
    clock = time.perf_counter()
    route = state.routes().routes.get(body.model)
    if route is None:
        state.metrics.requests.labels(UNROUTED, "", "404").inc()
        shown = body.model if len(body.model) <= 200 else f"{body.model[:200]}..."
        return _error(404, f"model {shown!r} is not routed by this gateway", "not_found")
    try:
        params = GenerationParams(
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.token_limit,
            n=body.n,
            seed=body.seed,
            stop=tuple(body.stop or ()),
        )
    except ProtocolError as exc:  # what the schema lets through and the model would refuse
        state.metrics.requests.labels(body.model, "", "400").inc()
        return _error(400, str(exc), "invalid_request_error")
    backend = route.choose(state.rng)
    trace_id, parent_id = _caller_context(request)
    raw_messages = body.raw_messages()
    response_id = feedback.new_response_id(trace_id, os.urandom(4).hex())
    call = _Call(
        state=state, body=body, triton_model=route.triton_model, version=backend.version,
        response_id=response_id, started_ns=started, clock=clock,
        span_facts={
            "trace_id": trace_id,
            "parent_span_id": parent_id,
            "start_ns": started,
            "requested_model": body.model,
            "triton_model": route.triton_model,
            "version": backend.version,
            "lora_name": backend.lora_name,
            "request_messages": raw_messages,
            "params": {"temperature": body.temperature, "top_p": body.top_p,
                       "max_tokens": body.token_limit, "stop": list(body.stop or ()),
                       "tools": body.tools},
            "metadata": body.metadata,
            "traffic": state.settings.traffic,
            "client": getattr(request.state, "principal", ANONYMOUS),
        },
    )  # fmt: skip
    # The call's own span context, as W3C Trace Context's traceresponse: a client that
    # sent none can still tie its record of the call to the gateway's.
    headers = {
        "x-spanmill-model-version": backend.version,
        "x-spanmill-trace-id": trace_id,
        "traceresponse": f"00-{trace_id}-{call.span_id}-01",
    }
    messages = chat.to_model_messages(raw_messages)
    target = Target(
        model=route.triton_model,
        version=backend.version,
        flavour=route.flavour,
        lora_name=backend.lora_name,
        base_model=route.base_model,
    )
    if body.stream:
        events = state.upstream.stream(target, messages, params, body.tools)
        try:
            # Errors Triton answers at once (a bad parameter, a version it lacks) keep
            # their HTTP status; the stream starts with the first piece of text.
            first = await _within(call, anext(events))
        except Exception as exc:  # StopAsyncIteration among them: no answer at all
            await events.aclose()
            failure = (
                UpstreamError(f"Triton model {route.triton_model} sent no answer", 502)
                if isinstance(exc, StopAsyncIteration)
                else _as_upstream_error(exc)
            )
            call.failed(str(failure), failure.status)
            return _upstream_error(failure)
        return _StreamedAnswer(
            _stream(call, first, events, release),
            write_timeout_s=state.settings.request_timeout_s,
            media_type="text/event-stream",
            headers=headers,
            # Also after a stream that never started (the client left at once).
            background=_after(release),
        )
    watch = _Departure(request.receive)
    try:
        result = await _within(
            call,
            state.upstream.generate(target, messages, params, body.tools),
        )
    except asyncio.CancelledError:
        if not watch.gone:
            raise  # the server stops
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        call.failed("the client closed the connection before the answer ended", 499)
        return Response(status_code=499)  # to nobody: the answer's end for the server
    except Exception as exc:
        failure = _as_upstream_error(exc)
        call.failed(str(failure), failure.status)
        return _upstream_error(failure)
    finally:
        watch.stop()
    choices, usage = call.answered(result)
    payload = {
        **call.head(result),
        "object": "chat.completion",
        "choices": [
            {"index": i, "message": c["message"], "finish_reason": c["finish_reason"],
             "logprobs": None}
            for i, c in enumerate(choices)
        ],
        "usage": usage,
    }  # fmt: skip
    return Response(
        to_json(payload), media_type="application/json", headers=headers,
        background=_after(call.flush),
    )  # fmt: skip


class _Departure:
    """Stops the request's task when its client goes away before the answer: nothing
    else tells a plain (not streamed) answer, so its generation would hold Triton, and
    the client's request slot, to its end or its deadline. Stopped, the call to Triton
    is closed, which stops the generation at the next token."""

    def __init__(self, receive: Callable[[], Awaitable[Any]]) -> None:
        self.gone = False
        self._task = asyncio.current_task()
        self._watch = asyncio.ensure_future(self._wait(receive))

    async def _wait(self, receive: Callable[[], Awaitable[Any]]) -> None:
        # The body was read whole: what comes next is the client's departure.
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._watch.cancel()


class _Stalled(Exception):
    """A client did not take a piece of its streamed answer within the bound."""


class _StreamedAnswer(StreamingResponse):
    """A streamed answer whose client must take each piece within ``write_timeout_s``.

    The server's ``send`` waits while the connection's buffers are full: a client that
    keeps its connection open but stops reading would otherwise hold the stream, its
    generation on Triton and its request slot for as long as it liked, since the call's
    deadline bounds only the waits for Triton. Such a client is taken as gone.
    """

    def __init__(
        self,
        content: AsyncGenerator[str, None],
        *,
        write_timeout_s: float,
        media_type: str,
        headers: dict[str, str],
        background: BackgroundTask,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers, background=background)
        self._content = content
        self._pieces_sent = False  # a piece of the answer went to the send (so it began)
        self.write_timeout_s = write_timeout_s

    async def stream_response(self, send: Any) -> None:
        # One timer a stream rather than one a piece (a timeout around each send added
        # about a third to the gateway's work on a piece): it wakes once per bound and
        # looks at the send under way.
        loop = asyncio.get_running_loop()
        bound = asyncio.timeout(None)
        began: float | None = None  # when the send under way began
        timer: asyncio.TimerHandle | None = None

        async def timed(message: Any) -> None:
            nonlocal began
            began = loop.time()
            if message["type"] == "http.response.body":
                self._pieces_sent = True
            await send(message)
            began = None

        def watch() -> None:
            nonlocal timer
            now = loop.time()
            if began is not None and now - began >= self.write_timeout_s:
                bound.reschedule(now)  # the send under way ends in TimeoutError, below
            else:
                since = now if began is None else began
                timer = loop.call_at(since + self.write_timeout_s, watch)

        timer = loop.call_later(self.write_timeout_s, watch)
        try:
            async with bound:
                await super().stream_response(timed)
        except TimeoutError:
            if bound.expired():
                raise _Stalled from None
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except _Stalled:
            log.warning(
                "a client took no part of its streamed answer for %g s "
                "(SPANMILL_GATEWAY_REQUEST_TIMEOUT_S): taken as gone",
                self.write_timeout_s,
            )
            # Returning with the response unfinished makes the server close the
            # connection. The slot is freed here too: a stream stalled before its
            # first piece never reached the generator's own release.
            if self.background is not None:
                await self.background()
            if not self._pieces_sent:
                # Stalled on the response's head: the answer's generator has not begun,
                # and closing it would run none of its ending (the call recorded as a
                # client gone, its stream to Triton closed). Its first piece is at hand.
                with suppress(StopAsyncIteration):
                    await anext(self._content)
        finally:
            # Now rather than whenever the generator is collected: left at a piece (its
            # client gone or stalled), it still holds its stream to Triton.
            await self._content.aclose()


def _after(step: Callable[[], None]) -> BackgroundTask:
    """A quick step to run once the response has left, in the event loop: Starlette runs
    a plain function's background task in its thread pool, whose hand-over to a worker
    thread and back cost more than the step itself."""

    async def run() -> None:
        step()

    return BackgroundTask(run)


async def _within(call: _Call, step: Awaitable[T]) -> T:
    """``step`` if it ends before the call's deadline; else it is cancelled (closing the
    stream to Triton stops the generation) and the call fails with 504."""
    limit = call.state.settings.request_timeout_s
    left = limit - (time.perf_counter() - call.clock)
    try:
        # In the request's own task: wait_for would make a task for every step.
        async with asyncio.timeout(max(left, 0.0)):
            return await step
    except TimeoutError:
        raise UpstreamError(
            f"the answer took longer than {limit:g} s (SPANMILL_GATEWAY_REQUEST_TIMEOUT_S); "
            "its generation was stopped",
            504,
        ) from None


def _as_upstream_error(exc: Exception) -> UpstreamError:
    """Any failure of a call, as the upstream error the client is answered with: a
    fault that is neither Triton's answer nor its absence (a bug, in the gateway or an
    upstream of another kind) is still answered in the API's shape, and recorded."""
    if isinstance(exc, UpstreamError):
        return exc
    log.error("a call failed in the gateway", exc_info=exc)
    return UpstreamError(f"the gateway failed: {type(exc).__name__}: {exc}", 500)


def _upstream_error(exc: UpstreamError) -> JSONResponse:
    kind = "invalid_request_error" if exc.status == 400 else "upstream_error"
    param = "messages" if exc.code == protocol.CONTEXT_LENGTH_EXCEEDED else None
    body = error_body(str(exc), kind, param=param, code=exc.code)
    # A full queue (429) drains within a batch or two, and an unreachable Triton (503)
    # is soon back or replaced: the client is told when to come back.
    headers = {"retry-after": "1"} if exc.status in (429, 503) else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _choices(result: GenerationResult, *, tools_offered: bool) -> Iterator[dict[str, Any]]:
    for choice in result.choices:
        calls = chat.parse_tool_calls(choice.text) if tools_offered else []
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else choice.text}
        if calls:
            message["tool_calls"] = calls
        yield {
            "message": message,
            "finish_reason": "tool_calls" if calls else choice.finish_reason,
            "token_ids": choice.token_ids,
            "logprobs": choice.logprobs,
        }


def _may_be_tool_call(text: str) -> bool | None:
    """Whether a reply that begins with ``text`` may be a JSON tool call (None: too soon)."""
    stripped = text.lstrip()
    return None if not stripped else stripped[0] in "{`"


async def _stream(
    call: _Call,
    first: list[str] | GenerationResult,
    events: AsyncGenerator[Any, None],
    release: Callable[[], None] = lambda: None,
) -> AsyncGenerator[str, None]:
    """Server-Sent Events in OpenAI's chunk format, each piece of text as Triton makes it.

    When tools are offered, a reply that begins like a JSON tool call is held until
    it ends and goes out as ``tool_calls``; any other reply streams as it comes.
    The spans are emitted once the answer ends. A client that goes away closes the
    stream to Triton, which stops generating; its span records that it went away.
    """
    try:
        body = call.body
        head = {**call.head(), "object": "chat.completion.chunk"}

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

        n = body.n
        text = [""] * n
        sent = [""] * n
        streaming: list[bool | None] = [None if body.tools else True] * n
        event: list[str] | GenerationResult = first
        try:
            # Inside: a client gone while these are written is recorded, and its
            # stream to Triton closed, as later on.
            for index in range(n):
                yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}])  # fmt: skip
            while not isinstance(event, GenerationResult):
                for index, piece in enumerate(event[:n]):
                    text[index] += piece
                    if streaming[index] is None:
                        held = _may_be_tool_call(text[index])
                        streaming[index] = None if held is None else not held
                    if streaming[index] and len(text[index]) > len(sent[index]):
                        new = text[index][len(sent[index]) :]
                        sent[index] = text[index]
                        yield chunk([{"index": index, "delta": {"content": new},
                                      "finish_reason": None}])  # fmt: skip
                try:
                    event = await _within(call, anext(events))
                except StopAsyncIteration:
                    raise UpstreamError(
                        f"Triton model {call.triton_model} ended early", 502
                    ) from None
        except Exception as exc:
            failure = _as_upstream_error(exc)
            call.failed(str(failure), failure.status)
            yield f"data: {json.dumps(error_body(str(failure), 'upstream_error'))}\n\n"
            yield "data: [DONE]\n\n"
            return
        except BaseException:
            # The client went away (the server cancels the response) or the server stops.
            call.failed("the client closed the connection before the answer ended", 499)
            raise
        finally:
            await events.aclose()  # closing the stream to Triton cancels what is left
        choices, usage = call.answered(event)
        head = {**call.head(event), "object": "chat.completion.chunk"}
        try:
            for index, choice in enumerate(choices):
                message = choice["message"]
                if message.get("tool_calls"):
                    delta: dict[str, Any] = {
                        "tool_calls": [
                            dict(c, index=i) for i, c in enumerate(message["tool_calls"])
                        ]
                    }
                    yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
                else:
                    whole = message.get("content") or ""
                    rest = whole[len(sent[index]) :] if whole.startswith(sent[index]) else ""
                    if rest:
                        yield chunk([{"index": index, "delta": {"content": rest},
                                      "finish_reason": None}])  # fmt: skip
                yield chunk(
                    [{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}]
                )
            if body.stream_options is not None and body.stream_options.get("include_usage"):
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"
        finally:
            call.flush()  # the answer was whole: its spans, even if the client left just now
    finally:
        release()  # the client's request slot, once the stream has ended
