"""OTLP/HTTP receiver: ``POST /v1/traces`` into the span topic, one message per trace.

Any OpenTelemetry-instrumented service can send spans here with its standard
OTLP/HTTP exporter (protobuf or JSON, gzip or not), without Kafka client code.
Each request is decoded and validated in full, then split by trace: every trace
becomes one OTLP protobuf message keyed by its trace id, so one trace stays on
one partition, in order. A protobuf request the native decoder reads whole is
forwarded as it came, its spans' bytes kept and only the framing written again
(:mod:`spanmill.collector.forward`); any other (JSON, or values the native decoder
leaves to the authority) is encoded again from its decoded spans. The reply waits
until Kafka has acknowledged every message, so a 200 means the spans are on the
topic.

Replies follow the OTLP/HTTP specification: 200 with an empty
``ExportTraceServiceResponse``, 400 with a ``google.rpc.Status`` naming what is
wrong (not to be retried), 413 for a body over the limit, 415 for an encoding we
do not take, 503 with ``Retry-After`` when Kafka is unavailable (to be retried).

``POST /v1/feedback`` takes late rewards for agents that do not call the gateway:
the same wire format, spans and replies as the gateway's (see
:mod:`spanmill.feedback`), and the same wait for Kafka's acknowledgement.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spanmill import feedback
from spanmill import semconv as sc
from spanmill import topic as span_topic
from spanmill.collector import forward
from spanmill.collector.decode import native_count
from spanmill.collector.metrics import CollectorMetrics
from spanmill.keys import ANONYMOUS
from spanmill.spans import Span, SpanDecodeError, detect_and_decode, encode_otlp_protobuf
from spanmill.spans.errors import BAD_PROTOBUF
from spanmill.spans.protowire import varint
from spanmill.store.rows import native_decoder

log = logging.getLogger(__name__)

_INVALID_ARGUMENT: Final = 3
_UNAVAILABLE: Final = 14
# Longer than the collector producer's delivery timeout (30 s), so that every wait
# ends with Kafka's own answer: a reply never guesses. An export answered 503 while its
# records were still on their way would be sent again, and stored twice.
_KAFKA_ANSWER_S: Final = 45.0
SERVICE_NAME: Final = "spanmill-collector"
PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    media_type: str
    headers: dict[str, str]


def status_message(code: int, message: str, as_json: bool) -> bytes:
    """A ``google.rpc.Status``: written by hand, it is two fields."""
    if as_json:
        return json.dumps({"code": code, "message": message}).encode()
    return b"\x08" + varint(code) + forward.len_field(2, message.encode())


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """Decompress at most ``limit + 1`` bytes, so that a small bomb cannot fill memory.

    Every member of a gzip body is read (RFC 1952 lets a body hold several, and gzip
    readers take them all); a stream cut short, or bytes after a deflate stream, are
    refused rather than read in part.
    """
    gzip = encoding == "gzip"
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise SpanDecodeError("bad_encoding", f"body is not valid {encoding}: {exc}") from None
        if len(out) > limit:
            return bytes(out)  # over the limit: refused as too large, whatever follows
        if not inflater.eof:
            raise SpanDecodeError("bad_encoding", f"body is {encoding} cut short: it ends early")
        rest = inflater.unused_data
        if not rest.strip(b"\x00"):  # the end, or a writer's zero padding after it
            return bytes(out)
        if not gzip:
            raise SpanDecodeError(
                "bad_encoding", f"body has {len(rest)} bytes after its {encoding} stream"
            )


def split_by_trace(spans: Sequence[Span]) -> dict[str, list[Span]]:
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


class OtlpReceiver:
    """Decodes OTLP/HTTP export requests and produces their traces to the span topic."""

    def __init__(
        self, producer: Any, topic: str, metrics: CollectorMetrics, max_bytes: int
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.metrics = metrics
        self.max_bytes = max_bytes
        self._local = threading.local()

    def _reply(self, status: int, body: bytes, as_json: bool, **headers: str) -> Reply:
        self.metrics.receiver_requests.labels(str(status)).inc()
        return Reply(status, body, JSON if as_json else PROTOBUF, headers)

    def export(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None,
        producer: str = ANONYMOUS,
    ) -> Reply:
        """Forward one export request; ``producer`` (who sent it, by key id) is stored with
        each span as ``spanmill.producer``, over anything the request said."""
        media = (content_type or "").split(";")[0].strip().lower()
        as_json = media == JSON or media.endswith("+json")
        encoding = (content_encoding or "identity").strip().lower()
        if encoding not in ("identity", "gzip", "deflate"):
            return self._reply(
                415,
                status_message(
                    _INVALID_ARGUMENT,
                    f"Content-Encoding {encoding!r} is not accepted; use gzip, deflate or none",
                    as_json,
                ),
                as_json,
            )
        try:
            if encoding != "identity":
                body = _inflate(body, encoding, self.max_bytes)
            if len(body) > self.max_bytes:
                return self._reply(
                    413,
                    status_message(
                        _INVALID_ARGUMENT,
                        f"request is over {self.max_bytes} bytes; export smaller batches",
                        as_json,
                    ),
                    as_json,
                )
            traces, count = self._traces(body, content_type, producer)
        except SpanDecodeError as exc:
            self.metrics.receiver_spans.labels("rejected").inc()
            return self._reply(
                400,
                status_message(_INVALID_ARGUMENT, f"{exc.reason}: {exc.detail}", as_json),
                as_json,
            )
        records = []
        for trace_id, (trace, encode) in traces.items():
            payloads, over = span_topic.fit(trace, encode, self.max_bytes)
            if over:
                self.metrics.receiver_spans.labels("rejected").inc(count)
                return self._reply(
                    413,
                    status_message(
                        _INVALID_ARGUMENT,
                        f"span {over[0].span_id} of trace {trace_id} is over {self.max_bytes} "
                        "bytes once encoded; keep large payloads out of span attributes",
                        as_json,
                    ),
                    as_json,
                )
            records += [(trace_id, payload) for payload, _ in payloads]
        from kafka.errors import KafkaError

        try:
            futures = [self._send(trace_id, payload) for trace_id, payload in records]
            deadline = time.monotonic() + _KAFKA_ANSWER_S
            for future in futures:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaError as exc:
            log.warning("OTLP export not forwarded to Kafka: %s", exc)
            self.metrics.receiver_spans.labels("unavailable").inc(count)
            return self._reply(
                503,
                status_message(_UNAVAILABLE, f"Kafka is unavailable: {exc}", as_json),
                as_json,
                **{"Retry-After": "5"},
            )
        self.metrics.receiver_spans.labels("accepted").inc(count)
        return self._reply(200, b"{}" if as_json else b"", as_json)

    def _traces(
        self, body: bytes, content_type: str | None, producer: str
    ) -> tuple[dict[str, tuple[Sequence[Any], Callable[[Any], bytes]]], int]:
        """Each trace's spans and how to encode some of them, and how many spans there
        are; raises SpanDecodeError for a request the collector would refuse."""
        count = native_count(self._decoder(), body, content_type, self.max_bytes)
        if count is not None:  # valid, read whole: forwarded as it came
            try:
                wire = forward.split(body, sc.SPANMILL_PRODUCER, producer)
            except ValueError as exc:  # what the decoder read, framed: not expected
                raise SpanDecodeError(BAD_PROTOBUF, str(exc)) from None
            traces: dict[str, tuple[Sequence[Any], Callable[[Any], bytes]]] = {
                t: (spans, wire.encode) for t, spans in wire.traces().items()
            }
            return traces, count
        spans = [
            span.model_copy(update={"resource_attributes": {
                **span.resource_attributes, sc.SPANMILL_PRODUCER: producer}})
            for span in detect_and_decode(body, content_type or None, max_bytes=self.max_bytes)
        ]  # fmt: skip
        decoded: dict[str, tuple[Sequence[Any], Callable[[Any], bytes]]] = {
            t: (trace, encode_otlp_protobuf) for t, trace in split_by_trace(spans).items()
        }
        return decoded, len(spans)

    def _decoder(self) -> Any:
        """This thread's native decoder (requests are answered on several threads)."""
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            decoder = self._local.decoder = native_decoder()
        return decoder

    def feedback(self, body: bytes, caller: feedback.Caller) -> Reply:
        """Feedback items as reward spans, answered once Kafka acknowledged each."""
        try:
            items = feedback.parse_feedback_body(body)
        except feedback.FeedbackError as exc:
            self.metrics.receiver_spans.labels("rejected").inc()
            return self._reply(exc.status, json.dumps(exc.body()).encode(), True)
        received = time.time_ns()
        spans = [
            feedback.feedback_span(
                item, caller, received, os.urandom(8).hex(), service_name=SERVICE_NAME
            )
            for item in items
        ]
        answer = feedback.answer(spans, self._send_and_wait(spans))
        accepted = len(spans) if answer.status == 200 else len(answer.body["delivered"])
        self.metrics.receiver_spans.labels("accepted").inc(accepted)
        self.metrics.receiver_spans.labels("unavailable").inc(len(spans) - accepted)
        return self._reply(answer.status, json.dumps(answer.body).encode(), True, **answer.headers)

    def _send(self, trace_id: str, payload: bytes) -> Any:
        """One OTLP protobuf record on the span topic, keyed by its trace."""
        return span_topic.send(self.producer, self.topic, trace_id, payload)

    def _send_and_wait(self, spans: Sequence[Span]) -> list[BaseException | None]:
        """Kafka's answer for each span: None where acknowledged.

        A span the producer refuses outright (its buffer full past ``max_block_ms``)
        was never buffered, so a retry of it cannot make a duplicate.
        """
        from kafka.errors import KafkaError

        futures: list[Any] = []
        for span in spans:
            try:
                futures.append(self._send(span.trace_id, encode_otlp_protobuf([span])))
            except KafkaError as exc:
                futures.append(exc)
        outcome: list[BaseException | None] = []
        for future in futures:
            if isinstance(future, BaseException):
                outcome.append(future)
                continue
            try:
                future.get(timeout=_KAFKA_ANSWER_S)
                outcome.append(None)
            except KafkaError as exc:
                log.warning("feedback span not delivered to Kafka: %s", exc)
                outcome.append(exc)
        return outcome
