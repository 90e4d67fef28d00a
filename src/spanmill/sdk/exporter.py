"""An OpenTelemetry span exporter that writes OTLP protobuf to Kafka.

Each Kafka message holds the spans of one trace and is keyed by the trace id (32
hex characters), so one trace stays on one partition, in order, which is what the
collector relies on to assemble episodes. A trace whose spans end in different
export batches simply becomes several messages with the same key.

Exporting never raises into the agent: a failure is logged, counted in
:attr:`KafkaSpanExporter.failed_spans` and reported to the span processor as
``FAILURE``. The producer is created on the first export, so an agent starts, and
keeps working, while Kafka is unreachable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from spanmill import topic as span_topic
from spanmill.config import KafkaSettings, load_settings
from spanmill.topic import trace_key

logger = logging.getLogger(__name__)


def _encode(spans: Sequence[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()


def _with_attributes(span: ReadableSpan, attributes: dict[str, Any]) -> ReadableSpan:
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _by_trace(spans: Sequence[ReadableSpan]) -> dict[int, list[ReadableSpan]]:
    """Spans grouped by trace id, traces in order of first appearance, spans in order."""
    groups: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        # The SDK always sets a context; a span without one has no trace to be keyed by.
        trace_id = span.context.trace_id if span.context is not None else 0
        groups.setdefault(trace_id, []).append(span)
    return groups


class KafkaSpanExporter(SpanExporter):
    """Send finished spans to Kafka as OTLP protobuf, one message per trace.

    ``settings`` says how to reach Kafka and which topic to write (its
    ``spans_topic``); without it, settings come from the ``SPANMILL_KAFKA_*``
    environment. ``timeout_s`` bounds how long one export waits for the broker's
    acknowledgements, and how long a send may block on a missing broker.
    """

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        timeout_s: float = 30.0,
        linger_ms: int = 5,
        client_id: str = "spanmill-sdk",
    ) -> None:
        if settings is None:
            settings = load_settings(KafkaSettings)
        self.settings = settings
        self.topic = settings.spans_topic
        self.timeout_s = timeout_s
        self._linger_ms = linger_ms
        self._client_id = client_id
        self._producer: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._counts_lock = threading.Lock()
        self.sent_spans = 0
        self.failed_spans = 0
        self.reduced_spans = 0  # sent without their most expendable attributes

    # -- SpanExporter --------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            logger.warning("span exporter is shut down; %d spans not sent", len(spans))
            self._count(failed=len(spans))
            return SpanExportResult.FAILURE
        try:
            return self._export(spans)
        except Exception as exc:
            # A tracing backend must never take the agent down with it.
            logger.error(
                "exporting %d spans to Kafka topic %r at %s failed: %s; check that the broker "
                "is up and SPANMILL_KAFKA_BOOTSTRAP_SERVERS points at it",
                len(spans),
                self.topic,
                self.settings.bootstrap_servers,
                exc,
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            self._count(failed=len(spans))
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        producer = self._producer
        if producer is None:
            return True
        try:
            producer.flush(timeout=timeout_millis / 1000)
        except Exception:
            logger.exception("flushing spans to Kafka topic %r failed", self.topic)
            return False
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.flush(timeout=self.timeout_s)
            producer.close(timeout=self.timeout_s)
        except Exception:
            logger.exception("closing the Kafka producer for topic %r failed", self.topic)

    # -- internals -----------------------------------------------------------------

    def _count(self, *, sent: int = 0, failed: int = 0) -> None:
        # A force_flush from another thread may export while the batch worker does.
        with self._counts_lock:
            self.sent_spans += sent
            self.failed_spans += failed

    def _get_producer(self) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the exporter is shut down")
            if self._producer is None:
                self._producer = span_topic.span_producer(
                    self.settings,
                    self._client_id,
                    delivery_timeout_s=self.timeout_s,
                    linger_ms=self._linger_ms,
                    max_block_s=self.timeout_s,
                )
            return self._producer

    def _messages(self, spans: list[ReadableSpan]) -> list[tuple[bytes, int]]:
        """Payloads of at most ``max_message_bytes``; a span alone over it is sent without
        its most expendable attributes (its token ids, then its prompt), as the gateway
        sends one, and not sent when it is over even so."""
        limit = self.settings.max_message_bytes
        messages, over = span_topic.fit(spans, _encode, limit)
        for span in over:
            trace = trace_key(span.context.trace_id).decode() if span.context else "?"
            payload = span_topic.reduced(span, limit, _encode, _with_attributes)
            if payload is not None:
                logger.warning(
                    "span %r (trace %s) is over SPANMILL_KAFKA_MAX_MESSAGE_BYTES (%d) as "
                    "OTLP: sent without its token ids or prompt (spanmill.span.reduced)",
                    span.name,
                    trace,
                    limit,
                )
                with self._counts_lock:
                    self.reduced_spans += 1
                messages.append((payload, 1))
                continue
            logger.error(
                "span %r (trace %s) is %d bytes as OTLP, over the limit of %d "
                "(SPANMILL_KAFKA_MAX_MESSAGE_BYTES) even without its token ids and prompt; "
                "it is not sent: keep large payloads out of span attributes",
                span.name,
                trace,
                len(_encode([span])),
                limit,
            )
            self._count(failed=1)
        return messages

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        producer = self._get_producer()
        result = SpanExportResult.SUCCESS
        pending = []
        for trace_id, group in _by_trace(spans).items():
            key = trace_key(trace_id)
            messages = self._messages(group)
            if sum(count for _, count in messages) < len(group):
                result = SpanExportResult.FAILURE
            for payload, count in messages:
                try:
                    future = span_topic.send(producer, self.topic, trace_id, payload)
                except Exception as exc:
                    self._failed_send(count, key, exc)
                    result = SpanExportResult.FAILURE
                else:
                    pending.append((future, count, key))
        deadline = time.monotonic() + self.timeout_s
        for future, count, key in pending:
            try:
                future.get(timeout=max(deadline - time.monotonic(), 0.001))
            except Exception as exc:
                self._failed_send(count, key, exc)
                result = SpanExportResult.FAILURE
            else:
                self._count(sent=count)
        return result

    def _failed_send(self, count: int, key: bytes, exc: Exception) -> None:
        logger.error(
            "sending %d spans of trace %s to Kafka topic %r at %s failed: %s",
            count,
            key.decode(),
            self.topic,
            self.settings.bootstrap_servers,
            exc,
        )
        self._count(failed=count)
