"""Getting the gateway's LLM spans to Kafka without ever slowing or failing a request.

Requests put spans on a bounded queue and return; one thread drains it into a
Kafka producer. When the queue is full (Kafka slow or down) a span is dropped and
counted: serving matters more than recording.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from spanmill.config import KafkaSettings
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.spans import Span, encode_otlp_protobuf

log = logging.getLogger(__name__)
_STOP = object()


class SpanEmitter:
    def __init__(self, kafka: KafkaSettings, metrics: GatewayMetrics, capacity: int = 10_000):
        self.kafka = kafka
        self.metrics = metrics
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="span-emitter", daemon=True)
        self._producer: Any = None
        self.emitted = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def emit(self, span: Span) -> None:
        """Queue a span for Kafka; never blocks."""
        try:
            self._queue.put_nowait(span)
        except queue.Full:
            self._drop("queue_full")
        self.metrics.span_queue.set(self._queue.qsize())

    def _drop(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.dropped += count
        self.metrics.spans_dropped.labels(reason).inc(count)

    def _delivered(self, _: Any) -> None:
        with self._lock:
            self.emitted += 1
        self.metrics.spans_emitted.inc()

    def _failed(self, exc: BaseException) -> None:
        log.warning("span not delivered to Kafka: %s", exc)
        self._drop("kafka_error")

    def _connect(self) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(
            **self.kafka.client_options(),
            acks="all",
            linger_ms=20,
            max_block_ms=5000,
            request_timeout_ms=10000,
            retries=3,
            compression_type="gzip",
        )

    def _run(self) -> None:
        backoff = 0.5
        while True:
            item = self._queue.get()
            self.metrics.span_queue.set(self._queue.qsize())
            if item is _STOP:
                break
            while self._producer is None:
                try:
                    self._producer = self._connect()
                    backoff = 0.5
                except Exception as exc:
                    log.warning("Kafka unreachable (%s); retrying in %.1fs", exc, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    # Spans that arrived meanwhile wait in the queue; a full queue drops.
            span: Span = item
            try:
                future = self._producer.send(
                    self.kafka.spans_topic,
                    key=span.trace_id.encode(),
                    value=encode_otlp_protobuf([span]),
                )
                future.add_callback(self._delivered)
                future.add_errback(self._failed)
            except Exception as exc:
                self._failed(exc)
        if self._producer is not None:
            self._producer.flush(timeout=5)
            self._producer.close(timeout=5)

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and stop the thread."""
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout=timeout)
