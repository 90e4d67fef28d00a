"""Write the fuzzer's seed inputs into ``fuzz/corpus/``: records of every shape.

``python fuzz/seeds.py`` (re)writes the ``seed-*`` files; what the fuzzer adds to the
corpus in ``make fuzz`` runs sits beside them under libFuzzer's own names.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from spanmill import semconv as sc
from spanmill.spans import Span, SpanEvent, SpanLink, encode_otlp_json, encode_otlp_protobuf

CORPUS = Path(__file__).resolve().parent / "corpus"
START = 1_750_000_000_000_000_000
HOUR = 3_600_000_000_000


def _span(n: int, **fields: object) -> Span:
    values: dict[str, object] = {
        "trace_id": f"{n + 1:032x}",
        "span_id": f"{n + 1:016x}",
        "name": "chat calculator",
        "start_time_unix_nano": START,
        "end_time_unix_nano": START + 1000,
        "resource_attributes": {sc.SERVICE_NAME: "agent"},
    }
    values.update(fields)
    return Span(**values)  # type: ignore[arg-type]


def records() -> dict[str, bytes]:
    chat = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "calculator",
        sc.SPANMILL_MODEL_VERSION: "3",
        sc.GEN_AI_INPUT_MESSAGES: '[{"role":"user","parts":[{"type":"text","content":"2+2?"}]}]',
        sc.SPANMILL_COMPLETION_TOKEN_IDS: [1, 2, 3],
        sc.SPANMILL_COMPLETION_LOGPROBS: [-0.1, -0.2, -0.3],
        "contact": "ops@example.com",
    }
    reward = SpanEvent(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=START + 10,
                       attributes={sc.GEN_AI_EVALUATION_NAME: "success",
                                   sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                                   sc.SPANMILL_REWARD_PRIMARY: True})  # fmt: skip
    foreign = {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hi",
               "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "hello",
               "llm.request.type": "chat"}  # fmt: skip
    shapes = {
        "plain": [_span(0)],
        "chat": [
            _span(1, attributes=chat, kind="client", status_code="error", status_message="upstream")
        ],
        "reward-event": [_span(2, events=[reward])],
        "reward-span": [
            _span(
                3,
                attributes={
                    sc.GEN_AI_EVALUATION_NAME: "resolved",
                    sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5,
                },
            )
        ],
        "links": [
            _span(
                4,
                links=[SpanLink(trace_id="ab" * 16, span_id="cd" * 8, attributes={"why": "retry"})],
            )
        ],
        "openllmetry": [_span(5, attributes=foreign)],
        "two-hours": [
            _span(6),
            _span(7, start_time_unix_nano=START + HOUR, end_time_unix_nano=START + HOUR + 5),
        ],
        # JSON texts that write what redaction looks for as escapes (it reads them decoded).
        "escaped-json": [
            _span(
                9,
                attributes={
                    sc.GEN_AI_INPUT_MESSAGES: '[{"role":"user","parts":[{"type":"text",'
                    '"content":"mail ann\\u0040example.org, card 4111\\u00201111 1111 1111"}]}]',
                    "arguments": '{"to":"bob\\u0040example.org","emoji":"\\ud83d\\ude00"}',
                },
            )
        ],
        "arrays": [
            _span(
                8,
                attributes={"b": [True, False], "s": ["x", "y"], "f": 1.5, "i": -7},
                resource_attributes={sc.SERVICE_NAME: "a", "rank": 2},
            )
        ],
    }
    found = {f"{name}.pb": encode_otlp_protobuf(spans) for name, spans in shapes.items()}
    found["chat.json"] = encode_otlp_json(shapes["chat"])
    found["many.pb"] = encode_otlp_protobuf([_span(i, attributes=chat) for i in range(20)])
    return found


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for name, payload in records().items():
        digest = hashlib.sha1(payload).hexdigest()[:8]
        (CORPUS / f"seed-{name}-{digest}").write_bytes(payload)
        print(f"seed-{name}-{digest}: {len(payload)} bytes")


if __name__ == "__main__":
    main()
