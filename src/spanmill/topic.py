"""Writing the span topic: one recipe for a span producer, one shape of record.

Every writer of spans builds its producer with :func:`span_producer` and writes with
:func:`send`; nothing else in spanmill makes a producer for spans. The writers are the
SDK's exporter in an agent, the gateway (the calls it serves, and feedback) and the
collector's OTLP receiver (exports, and feedback). A record on the topic is:

- value: one OTLP protobuf ``ExportTraceServiceRequest`` with spans of one trace, at
  most ``max_message_bytes`` (:func:`fit` halves a trace's spans until each part fits,
  and hands back a single span that cannot fit; :func:`reduced` makes such a span fit
  without its most expendable attributes, named in ``spanmill.span.reduced``, and a
  writer says so of one that does not fit even then);
- key: the trace id as 32 lowercase hex characters, so a trace stays on one
  partition, in order, which is what the collector assembles episodes from;
- header ``content-type: application/x-protobuf``.

The producer waits for every in-sync replica (``acks=all``) and is idempotent, so
that its own retries never write a record twice; it compresses with lz4, which the
``kafka`` extra installs for readers and writers alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from spanmill import semconv as sc

if TYPE_CHECKING:
    from spanmill.config import KafkaSettings

# Room for a record's key, headers and framing on top of its value.
RECORD_OVERHEAD_BYTES: Final = 4096
HEADERS: Final = [(sc.CONTENT_TYPE_HEADER, sc.CONTENT_TYPE_OTLP_PROTOBUF.encode())]
COMPRESSION: Final = "lz4"

T = TypeVar("T")
# What a call's span can do without, most expendable first: the token ids and logprobs
# (training re-tokenises the text), then the prompt's messages (the answer, the model,
# the usage and the rewards' link stay).
EXPENDABLE: Final = (
    (
        sc.SPANMILL_PROMPT_TOKEN_IDS,
        sc.SPANMILL_COMPLETION_TOKEN_IDS,
        sc.SPANMILL_COMPLETION_LOGPROBS,
    ),
    (sc.GEN_AI_INPUT_MESSAGES,),
)


class _Attributed(Protocol):
    @property
    def attributes(self) -> Mapping[str, Any] | None: ...


S = TypeVar("S", bound=_Attributed)


def trace_key(trace_id: str | int) -> bytes:
    """The record key of a trace: its id as 32 lowercase hex characters."""
    if isinstance(trace_id, int):
        return format(trace_id, "032x").encode()
    return trace_id.lower().encode()


def span_producer(
    kafka: KafkaSettings,
    client_id: str,
    *,
    delivery_timeout_s: float,
    linger_ms: int = 5,
    max_block_s: float = 10.0,
) -> Any:
    """A producer for the span topic.

    ``delivery_timeout_s`` is how long a record may wait for Kafka, retried, before
    its send fails: an outage shorter than that loses nothing. ``max_block_s`` bounds
    how long a send may block on a full buffer or a broker not yet reached.
    """
    from kafka import KafkaProducer

    delivery_ms = int(delivery_timeout_s * 1000)
    request_ms = min(10_000, max(500, delivery_ms // 2))
    block_ms = int(max_block_s * 1000)
    return KafkaProducer(
        **kafka.client_options(),
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        compression_type=COMPRESSION,
        linger_ms=linger_ms,
        max_request_size=kafka.max_message_bytes + RECORD_OVERHEAD_BYTES,
        max_block_ms=block_ms,
        bootstrap_timeout_ms=block_ms,
        request_timeout_ms=request_ms,
        # kafka-python insists that delivery outlasts one linger and one request.
        delivery_timeout_ms=max(delivery_ms, linger_ms + request_ms + 1),
    )


def send(producer: Any, topic: str, trace_id: str | int, payload: bytes) -> Any:
    """One record of one trace's spans; returns the producer's future."""
    return producer.send(topic, key=trace_key(trace_id), value=payload, headers=HEADERS)


def fit(
    spans: Sequence[T], encode: Callable[[Sequence[T]], bytes], max_bytes: int
) -> tuple[list[tuple[bytes, int]], list[T]]:
    """A trace's spans as payloads of at most ``max_bytes`` (with how many spans each
    holds), halving the spans until each part fits; and the spans that alone are over."""
    if not spans:
        return [], []
    payload = encode(spans)
    if len(payload) <= max_bytes:
        return [(payload, len(spans))], []
    if len(spans) == 1:
        return [], [spans[0]]
    middle = len(spans) // 2
    first, over_first = fit(spans[:middle], encode, max_bytes)
    second, over_second = fit(spans[middle:], encode, max_bytes)
    return first + second, over_first + over_second


def reduced(
    span: S,
    max_bytes: int,
    encode: Callable[[Sequence[S]], bytes],
    without: Callable[[S, dict[str, Any]], S],
) -> bytes | None:
    """``span`` as a record's value within ``max_bytes``, with the fewest expendable
    attributes (:data:`EXPENDABLE`) left off and named in ``spanmill.span.reduced``; None
    when it is over even without them. ``without(span, attributes)``: the span with those
    attributes instead of its own."""
    left_off: list[str] = []
    present = dict(span.attributes or {})
    for names in EXPENDABLE:
        left_off += [name for name in names if name in present]
        attributes = {k: v for k, v in present.items() if k not in left_off}
        attributes[sc.SPANMILL_SPAN_REDUCED] = list(left_off)
        payload = encode([without(span, attributes)])
        if len(payload) <= max_bytes:
            return payload
    return None


def partitions_of(consumer: Any, topic: str, timeout_s: float = 15.0) -> set[int] | None:
    """``topic``'s partitions as ``consumer``'s client learns them (an empty set: no such
    topic), or None where Kafka has not said within ``timeout_s``.

    kafka-python waits for a topic's metadata without a bound where no broker answers
    (brokers lost after the client's first contact): the question is asked on a daemon
    thread, left behind if it never returns, and the caller goes on.
    """
    from concurrent.futures import wait

    from spanmill.daemons import on_daemon_threads

    (asked,) = on_daemon_threads(consumer.partitions_for_topic, [topic], 1)
    if not wait([asked], timeout=timeout_s).done:
        return None
    return set(asked.result() or ())
