"""The collector's HTTP side: OTLP/HTTP receiver, Prometheus metrics, health and readiness."""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver, status_message
from spanmill.feedback import Caller, declared_too_large
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
) -> FastAPI:
    """``exposition``: what /metrics shows (anything with ``collect()``); the registry if None.
    ``keys``: the producers the receiver takes, by key; None takes any caller."""
    app = FastAPI(title="spanmill collector", docs_url=None, redoc_url=None)

    def producer(request: Request) -> str | None:
        """Who sends: the id of the key presented; None when a key is asked and none fits."""
        if keys is None or not keys.required:
            return ANONYMOUS
        token = bearer(request.headers.get("authorization", "").encode() or None)
        return keys.identify(token) if token is not None else None

    shown = exposition if exposition is not None else metrics.registry

    @app.get("/healthz")
    def healthz() -> Response:
        ok = health.alive
        return Response(b"ok" if ok else b"stuck", status_code=200 if ok else 503)

    @app.get("/readyz")
    def readyz() -> Response:
        ok = health.ready
        return Response(b"ready" if ok else b"not ready", status_code=200 if ok else 503)

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(shown), media_type=CONTENT_TYPE_LATEST)

    if receiver is not None:

        @app.post("/v1/traces")
        async def traces(request: Request) -> Response:
            who = producer(request)
            as_json = "json" in request.headers.get("content-type", "")
            if who is None:
                return Response(
                    status_message(16, "missing or unknown producer key", as_json),
                    status_code=401,
                )
            limit = receiver.max_bytes
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                return Response(
                    status_message(
                        3, f"request is over {limit} bytes; export smaller batches", as_json
                    ),
                    status_code=413,
                )
            body = await request.body()
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
            if who is None:
                return JSONResponse(
                    {"error": {"message": "missing or unknown producer key",
                               "type": "authentication_error"}},
                    status_code=401,
                )  # fmt: skip
            error = declared_too_large(request.headers.get("content-length"))
            if error is not None:
                return JSONResponse(error.body(), status_code=error.status)
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

    return app
