"""The collector's HTTP side: OTLP/HTTP receiver, Prometheus metrics, health and readiness."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from spanmill.bodylimit import BodyLimit, Limit, Scope, header
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver, status_message
from spanmill.feedback import MAX_BODY_BYTES, Caller, too_large
from spanmill.keys import ANONYMOUS, KeyRing, bearer


class Health(Protocol):
    @property
    def alive(self) -> bool: ...

    @property
    def ready(self) -> bool: ...


def create_app(
    health: Health,
    metrics: CollectorMetrics,
    receiver: OtlpReceiver | None = None,
    exposition: Any = None,
    keys: KeyRing | None = None,
    admin: KeyRing | None = None,
    store: tuple[str, Mapping[str, Any]] | None = None,
) -> FastAPI:
    """``exposition``: what /metrics shows (anything with ``collect()``); the registry if None.
    ``keys``: the producers the receiver takes, by key; None takes any caller.
    ``admin``: the credential of the /admin routes (erasure requests against ``store``,
    its URL and storage options); None refuses them."""
    app = FastAPI(title="spanmill collector", docs_url=None, redoc_url=None)

    def producer(request: Request) -> str:
        """Who sends: the id of the key presented, as :class:`_Producers` found it."""
        who: str = request.state.producer
        return who

    shown = exposition if exposition is not None else metrics.registry

    # The probes and /metrics answer in the event loop, not in the thread pool where
    # exports may all be waiting for Kafka: a slow Kafka must not fail the probes.
    @app.get("/healthz")
    async def healthz() -> Response:
        ok = health.alive
        return Response(b"ok" if ok else b"stuck", status_code=200 if ok else 503)

    @app.get("/readyz")
    async def readyz() -> Response:
        ok = health.ready
        return Response(b"ready" if ok else b"not ready", status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(shown), media_type=CONTENT_TYPE_LATEST)

    if receiver is not None:

        @app.post("/v1/traces")
        async def traces(request: Request) -> Response:
            who = producer(request)
            body = await request.body()  # at most receiver.max_bytes (BodyLimit)
            reply = await run_in_threadpool(
                receiver.export,
                body,
                request.headers.get("content-type"),
                request.headers.get("content-encoding"),
                who,
            )
            return Response(
                reply.body,
                status_code=reply.status,
                media_type=reply.media_type,
                headers=reply.headers,
            )

        @app.post("/v1/feedback")
        async def feedback(request: Request) -> Response:
            who = producer(request)
            address = request.client.host if request.client is not None else None
            reply = await run_in_threadpool(
                receiver.feedback, await request.body(), Caller(who, address)
            )
            return Response(
                reply.body,
                status_code=reply.status,
                media_type=reply.media_type,
                headers=reply.headers,
            )

        # Bodies are bounded before they are read, chunked ones too.
        def traces_too_large(scope: Scope, limit: int) -> Response:
            as_json = b"json" in (header(scope, b"content-type") or b"")
            message = f"request is over {limit} bytes; export smaller batches"
            return Response(status_message(3, message, as_json), status_code=413)

        def feedback_too_large(scope: Scope, limit: int) -> Response:
            error = too_large()
            return JSONResponse(error.body(), status_code=error.status)

        limits = {
            "/v1/traces": Limit(receiver.max_bytes, traces_too_large),
            "/v1/feedback": Limit(MAX_BODY_BYTES, feedback_too_large),
        }
        app.add_middleware(BodyLimit, limits=limits)
        # Added last, so outermost: a caller without a key is refused before its body
        # is read (BodyLimit reads a chunked body whole before the route runs).
        app.add_middleware(_Producers, keys=keys, paths=tuple(limits))
    if store is not None:
        _admin_routes(app, admin, *store)
    return app


class _Producers:
    """Who sends, as a plain ASGI middleware on the receiver's ``paths``: the id of the
    key presented (``anonymous`` where no key is asked) goes into the request's state;
    a request without a key that fits is answered 401 before its body is read."""

    def __init__(self, app: Any, keys: KeyRing | None, paths: tuple[str, ...]) -> None:
        self.app = app
        self.keys = keys
        self.paths = paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            who: str | None = ANONYMOUS
            if self.keys is not None and self.keys.required:
                token = bearer(header(scope, b"authorization"))
                who = self.keys.identify(token) if token is not None else None
            if who is None:
                if scope["path"] == "/v1/traces":
                    as_json = b"json" in (header(scope, b"content-type") or b"")
                    message = status_message(16, "missing or unknown producer key", as_json)
                    refused: Response = Response(message, status_code=401)
                else:
                    refused = _error(401, "missing or unknown producer key",
                                     "authentication_error")  # fmt: skip
                await refused(scope, receive, send)
                return
            scope.setdefault("state", {})["producer"] = who
        await self.app(scope, receive, send)


def _admin_routes(
    app: FastAPI, admin: KeyRing | None, store_url: str, storage_options: Mapping[str, Any]
) -> None:
    """``POST /admin/erasures`` (one of ``user_id``, ``conversation_id``, ``trace_id``, and
    ``requested_by``, ``reason``) and ``GET /admin/erasures``, as ``spanmill store erase``
    and ``spanmill store erasures``; behind their own bearer token."""

    def refused(request: Request) -> JSONResponse | None:
        if admin is None or not admin.admin_configured:
            return _error(403, "the admin routes need their own credential, and none is set "
                          "(SPANMILL_COLLECTOR_ADMIN_API_KEY)", "permission_error")  # fmt: skip
        token = bearer(request.headers.get("authorization", "").encode() or None)
        if token is None or not admin.is_admin(token):
            return _error(401, "missing or wrong admin token", "authentication_error")
        return None

    @app.get("/admin/erasures")
    async def erasures(request: Request) -> Response:
        from spanmill.store import SpanStore
        from spanmill.store.erasure import read_erasures

        error = refused(request)
        if error is not None:
            return error
        span_store = SpanStore(store_url, storage_options)
        found = await run_in_threadpool(read_erasures, span_store.fs, span_store.root)
        return JSONResponse({"erasures": [_shown(e) for e in found]})

    @app.post("/admin/erasures")
    async def erase(request: Request) -> Response:
        from spanmill.store import SpanStore
        from spanmill.store.compact import request_erasure

        error = refused(request)
        if error is not None:
            return error
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the body must be a JSON object", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request_error")
        subjects = [
            s for s in ("user_id", "conversation_id", "trace_id") if isinstance(body.get(s), str)
        ]
        requested_by = body.get("requested_by")
        if (
            len(subjects) != 1
            or not body[subjects[0]]
            or not isinstance(requested_by, str)
            or not requested_by
        ):
            return _error(
                400, "give exactly one of user_id, conversation_id, trace_id (a non-empty "
                "string), and requested_by: who asks", "invalid_request_error",
            )  # fmt: skip
        subject = subjects[0]
        reason = body.get("reason")
        reason = reason if isinstance(reason, str) else ""
        span_store = SpanStore(store_url, storage_options)
        policy = await run_in_threadpool(span_store.policy)
        erasure = await run_in_threadpool(
            lambda: request_erasure(
                store_url, storage_options, subject, body[subject],  # type: ignore[arg-type]
                requested_by=requested_by, reason=reason,
                attribute=policy.user_id_attribute,
            )
        )  # fmt: skip
        return JSONResponse(_shown(erasure), status_code=202)


def _shown(erasure: Any) -> dict[str, Any]:
    """A record as the API shows it: never the subject's value."""
    shown: dict[str, Any] = erasure.model_dump(mode="json", exclude={"value"})
    return shown


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)
