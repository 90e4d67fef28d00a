"""The OTLP receiver: a protobuf export forwarded as it came, against decoding it into
spans and encoding each trace again (what every request took before, and what JSON and
values the native decoder leaves to the authority still take), in the same run.

Both run the receiver's whole export (size checks, validation, the split by trace, the
producer's attribute, a record per trace handed to a producer that acknowledges at once),
without HTTP and Kafka, whose costs are the same either way.
"""

from __future__ import annotations

import json
from typing import Any

from bench import median_seconds
from spanmill import semconv as sc
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver
from spanmill.spans import Span, encode_otlp_protobuf

ROUNDS = 200
BASE_NS = 1_750_000_000_000_000_000


class _Acknowledged:
    def get(self, timeout: float) -> None:
        return None


class _Producer:
    def send(self, topic: str, key: bytes, value: bytes, headers: Any) -> _Acknowledged:
        return _Acknowledged()


def _span(i: int, traces: int) -> Span:
    text = json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"what is {i}?"}]}])
    return Span(
        trace_id=f"{i % traces + 1:032x}", span_id=f"{i + 1:016x}", name="chat smollm2",
        start_time_unix_nano=BASE_NS + i, end_time_unix_nano=BASE_NS + i + 1_000_000,
        attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT, sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.GEN_AI_INPUT_MESSAGES: text, sc.GEN_AI_USAGE_INPUT_TOKENS: 42,
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [17, 2, i], "custom.ratio": 0.5,
        },
        resource_attributes={sc.SERVICE_NAME: "agent"},
    )  # fmt: skip


def _rate(receiver: OtlpReceiver, body: bytes) -> float:
    def export() -> None:
        for _ in range(ROUNDS):
            receiver.export(body, sc.CONTENT_TYPE_OTLP_PROTOBUF, None)

    export()  # warm: the decoder's key cache, the first imports
    return ROUNDS / median_seconds(export)


def main() -> None:
    metrics = CollectorMetrics()
    forwarding = OtlpReceiver(_Producer(), "spans", metrics, 16 << 20)
    decoding = OtlpReceiver(_Producer(), "spans", metrics, 16 << 20)
    decoding._decoder = lambda: None  # type: ignore[method-assign]
    if forwarding._decoder() is None:
        print("no native decoder (the C extension is not built): every request is decoded")
        return
    for spans, traces in ((1, 1), (100, 10)):
        body = encode_otlp_protobuf([_span(i, traces) for i in range(spans)])
        forwarded, decoded = _rate(forwarding, body), _rate(decoding, body)
        print(
            f"{spans} spans of {traces} trace(s) a request ({len(body):,} bytes): forwarded "
            f"{forwarded:,.0f} requests/s ({forwarded * spans:,.0f} spans/s), decoded and "
            f"encoded again {decoded:,.0f} requests/s ({decoded * spans:,.0f} spans/s); "
            f"ratio {forwarded / decoded:.1f}"
        )
