"""Getting the gateway's spans to Kafka: LLM spans without ever slowing a request,
feedback spans with an acknowledgement.

Requests put spans on a bounded queue; one thread drains it into a Kafka producer.
LLM spans are fire-and-forget (:meth:`SpanEmitter.emit`). Through a Kafka outage
they wait, never holding a request up: up to ``capacity`` in the producer, unsent,
each for at most ``outage_s``, and as many again in the queue; past that a span is
dropped and counted (``spanmill_gateway_spans_dropped_total``), as serving matters
more than recording. When Kafka returns, what waited is sent. Feedback is the
caller's own data and must be neither lost nor sent twice, so
:meth:`SpanEmitter.deliver` waits for Kafka's acknowledgement of every span (at most
30 s, on a producer of its own), and refuses up front (:class:`EmitterBusy`) rather
than drop: a refused delivery sent nothing, so the caller may retry it whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from spanmill import topic as span_topic
from spanmill.config import KafkaSettings
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.spans import Span, encode_otlp_protobuf

log = logging.getLogger(__name__)
_STOP = object()
# How long a delivery may wait in the queue before it is withdrawn, unsent.
QUEUE_WAIT_S = 5.0
# Kafka answers for every feedback span within this (its producer's delivery timeout).
_FEEDBACK_S = 30.0
# How long an LLM span may wait for Kafka, unsent, before it is dropped.
OUTAGE_S = 300.0

Outcome = list[BaseException | None]


def reduced(span: Span, limit: int) -> bytes | None:
    """``span`` as OTLP within ``limit`` bytes (:func:`spanmill.topic.reduced`)."""
    return span_topic.reduced(span, limit, encode_otlp_protobuf, _with_attributes)


def _with_attributes(span: Span, attributes: dict[str, Any]) -> Span:
    return span.model_copy(update={"attributes": attributes})


class SpanTooLarge(ValueError):
    """A span over the topic's record limit: never sent, counted as ``too_large``."""


class EmitterBusy(Exception):
    """The spans were not taken (queue full, or Kafka too slow to reach them): none sent."""


class _Delivery:
    """Spans whose sender waits for Kafka's answer on each.

    A delivery is withdrawn, unsent, if the sender gives up while it is queued;
    once the producer thread has begun sending it, it runs to Kafka's answer.
    """

    def __init__(self, spans: Sequence[Span], done: Callable[[Outcome], None]) -> None:
        self.spans = list(spans)
        self._done = done
        self._lock = threading.Lock()
        self._state = "queued"
        self._outcome: Outcome = [None] * len(self.spans)
        self._pending = len(self.spans)

    def begin(self) -> bool:
        """Called by the producer thread: False if the sender withdrew it."""
        with self._lock:
            if self._state == "withdrawn":
                return False
            self._state = "sending"
            return True

    def withdraw(self) -> bool:
        """Called by the sender: True if it was still queued, and now never will be sent."""
        with self._lock:
            if self._state == "queued":
                self._state = "withdrawn"
                return True
            return False

    def settle(self, index: int, failure: BaseException | None) -> None:
        with self._lock:
            self._outcome[index] = failure
            self._pending -= 1
            finished = self._pending == 0
        if finished:
            self._done(self._outcome)


class SpanEmitter:
    def __init__(
        self,
        kafka: KafkaSettings,
        metrics: GatewayMetrics,
        capacity: int = 10_000,
        outage_s: float = OUTAGE_S,
    ):
        self.kafka = kafka
        self.metrics = metrics
        self.outage_s = outage_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        # LLM spans handed to the producer and not yet answered: at most ``capacity``.
        self._unanswered = threading.BoundedSemaphore(capacity)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="span-emitter", daemon=True)
        self._producer: Any = None
        self._feedback_producer: Any = None
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

    async def deliver(self, spans: Sequence[Span], queue_wait_s: float = QUEUE_WAIT_S) -> Outcome:
        """Send spans and wait for Kafka's answer on each: None where acknowledged.

        Raises :class:`EmitterBusy`, having sent nothing, when the queue is full or
        the spans waited in it longer than ``queue_wait_s`` (Kafka unreachable).
        """
        if not spans:
            return []
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Outcome] = loop.create_future()

        def done(outcome: Outcome) -> None:  # on a producer thread
            # The loop is closed only when the app has stopped, and its caller with it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, answered, outcome)

        delivery = _Delivery(spans, done)
        try:
            self._queue.put_nowait(delivery)
        except queue.Full:
            raise EmitterBusy("the span queue is full") from None
        self.metrics.span_queue.set(self._queue.qsize())
        try:
            return await asyncio.wait_for(asyncio.shield(answered), queue_wait_s)
        except TimeoutError:
            if delivery.withdraw():
                raise EmitterBusy(f"Kafka did not take the spans within {queue_wait_s}s") from None
        # Being sent: the producer's delivery timeout bounds the wait for its answer.
        return await answered

    def _drop(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.dropped += count
        self.metrics.spans_dropped.labels(reason).inc(count)

    def _delivered(self, _: Any) -> None:
        with self._lock:
            self.emitted += 1
        self.metrics.spans_emitted.inc()

    def _answered(self, _: Any) -> None:
        self._unanswered.release()
        self._delivered(_)

    def _failed(self, exc: BaseException) -> None:
        self._unanswered.release()
        log.warning("span not delivered to Kafka: %s", exc)
        self._drop("too_large" if isinstance(exc, SpanTooLarge) else "kafka_error")

    def _connect(self, client_id: str, delivery_timeout_s: float) -> Any:
        return span_topic.span_producer(
            self.kafka,
            client_id,
            delivery_timeout_s=delivery_timeout_s,
            linger_ms=20,
            max_block_s=5.0,
        )

    def _connect_both(self) -> None:
        """The LLM spans' producer, which waits out an outage, and the feedback's, whose
        caller waits for the answer: its delivery timeout bounds that wait."""
        self._producer = self._connect("spanmill-gateway", self.outage_s)
        try:
            self._feedback_producer = self._connect("spanmill-gateway-feedback", _FEEDBACK_S)
        except BaseException:
            self._producer.close(timeout=0)
            self._producer = None
            raise

    def _run(self) -> None:
        backoff = 0.5
        while True:
            item = self._queue.get()
            self.metrics.span_queue.set(self._queue.qsize())
            if item is _STOP:
                break
            while self._producer is None and not self._stopping.is_set():
                try:
                    self._connect_both()
                    backoff = 0.5
                except Exception as exc:
                    log.warning("Kafka unreachable (%s); retrying in %.1fs", exc, backoff)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
                    # Spans that arrived meanwhile wait in the queue; a full queue drops.
            if self._producer is None:  # stopping, and Kafka was never reached
                self._abandon(item)
                continue
            if isinstance(item, _Delivery):
                self._send_delivery(item)
                continue
            span: Span = item
            # Kafka away: spans wait in the producer up to the bound, then in the queue.
            while not self._unanswered.acquire(timeout=0.5):
                if self._stopping.is_set():
                    break
            else:
                try:
                    future = self._send(self._producer, span)
                    future.add_callback(self._answered)
                    future.add_errback(self._failed)
                except Exception as exc:
                    self._failed(exc)
                continue
            self._drop("shutdown")
        for producer in (self._producer, self._feedback_producer):
            if producer is not None:
                producer.flush(timeout=5)
                producer.close(timeout=5)

    def _send(self, producer: Any, span: Span) -> Any:
        """Hand one span to ``producer`` as a record of its trace, reduced to fit where it
        is over ``max_message_bytes`` (:func:`reduced`); raises :class:`SpanTooLarge` for
        one that does not fit even so."""
        limit = self.kafka.max_message_bytes
        fitted, over = span_topic.fit([span], encode_otlp_protobuf, limit)
        if over:
            payload = reduced(span, limit)
            if payload is None:
                raise SpanTooLarge(
                    f"span {span.span_id} is over SPANMILL_KAFKA_MAX_MESSAGE_BYTES ({limit}) "
                    "as OTLP, even without its token ids and prompt"
                )
            self.metrics.spans_reduced.inc()
            log.warning("span %s is over SPANMILL_KAFKA_MAX_MESSAGE_BYTES (%d): sent reduced",
                        span.span_id, limit)  # fmt: skip
            fitted = [(payload, 1)]
        return span_topic.send(producer, self.kafka.spans_topic, span.trace_id, fitted[0][0])

    def _send_delivery(self, delivery: _Delivery) -> None:
        if not delivery.begin():
            return
        blocked: Exception | None = None
        for index, span in enumerate(delivery.spans):
            if blocked is not None:  # each would wait as long again: refused at once
                delivery.settle(index, blocked)
                continue
            try:
                future = self._send(self._feedback_producer, span)
            except SpanTooLarge as exc:  # this span alone: it will never be sent
                delivery.settle(index, exc)
                continue
            except Exception as exc:  # the producer cannot take more now (its buffer full)
                delivery.settle(index, exc)
                blocked = exc
                continue
            future.add_callback(self._acknowledged, delivery, index)
            future.add_errback(self._refused, delivery, index)

    def _acknowledged(self, delivery: _Delivery, index: int, metadata: Any) -> None:
        self._delivered(metadata)
        delivery.settle(index, None)

    def _abandon(self, item: Any) -> None:
        """What the gateway leaves unsent as it stops: counted, and a waiting feedback
        sender answered (its delivery refused, so that it may send it again)."""
        if isinstance(item, _Delivery):
            if item.begin():
                for index in range(len(item.spans)):
                    item.settle(index, EmitterBusy("the gateway stopped before Kafka was reached"))
            return
        self._drop("shutdown")

    def _refused(self, delivery: _Delivery, index: int, exc: BaseException) -> None:
        log.warning("feedback span not delivered to Kafka: %s", exc)
        delivery.settle(index, exc)

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and stop the thread."""
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout=timeout)


def _resolve(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)
