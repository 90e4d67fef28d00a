"""Redaction rules: built-in patterns, custom ones, and attribute allow and deny lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanmill.collector.batch import BatchProcessor, ProcessingConfig
from spanmill.collector.decode import decode_spans
from spanmill.collector.redact import Redactor, luhn_valid
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store.rows import HourlyColumns, SpanParts, native_decoder

DECODER = native_decoder()


def parts(**attributes: object) -> SpanParts:
    return SpanParts(
        "1" * 32,
        "2" * 16,
        None,
        "mail bob@corp.io",
        "client",
        1,
        2,
        "error",
        "key sk-abcdefghijklmnop1234 leaked",
        dict(attributes),
        {"host": "h"},
        "",
        "",
        [("log", 1, {"msg": "ping ann@x.org"})],
        [("3" * 32, "4" * 16, {"k": "AKIAABCDEFGHIJKLMNOP"})],
    )


BUILTIN_EXAMPLES = pytest.mark.parametrize(
    ("text", "expected", "rule"),
    [
        ("write to jane.doe+x@mail.example.co.uk now", "write to [REDACTED:email] now", "email"),
        ("token sk-proj-AbCdEf0123456789XyZ_-q", "token [REDACTED:api_key]", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE", "aws [REDACTED:api_key]", "api_key"),
        ("gh ghp_" + "a" * 36, "gh [REDACTED:api_key]", "api_key"),
        (
            "Authorization: Bearer abcdefghijklmnopqrstuvwxyz.123",
            "Authorization: [REDACTED:api_key]",
            "api_key",
        ),
        ("hf_" + "B" * 34, "[REDACTED:api_key]", "api_key"),
        ("(pk-" + "c" * 20 + ")", "([REDACTED:api_key])", "api_key"),
        # A key right after a word-bound lookalike that swallowed it is still found.
        (
            "xsk-" + "a" * 18 + "-sk-" + "b" * 20,
            "xsk-" + "a" * 18 + "-[REDACTED:api_key]",
            "api_key",
        ),
        # A bearer token is replaced whole, whatever key it carries.
        ("Bearer sk-" + "d" * 24, "[REDACTED:api_key]", "api_key"),
        ("card 4111-1111-1111-1111.", "card [REDACTED:card_number].", "card_number"),
        ("amex 378282246310005", "amex [REDACTED:card_number]", "card_number"),
        # Python's \\d takes the digits of every script.
        ("pay 4" + "\u0661" * 15, "pay [REDACTED:card_number]", "card_number"),
    ],
)


@BUILTIN_EXAMPLES
def test_builtin_patterns(text: str, expected: str, rule: str) -> None:
    counts: dict[str, int] = {}
    span = parts(text=text)
    Redactor().apply(span, counts)
    assert span.attributes["text"] == expected
    assert counts.get(rule, 0) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "started at 1750000000000000000 ns",  # a timestamp, not a card
        "order 4111111111111112",  # fails the Luhn check
        "id 94111111111111111111",  # the middle of a longer number
        "plain text with sk- but short sk-abc",
        "task-1 and mask-abcdefghijklmnopqrstuvwxyz",  # no key starts inside a word
        "an @ sign alone, or me@localhost",
    ],
)
def test_lookalikes_are_left_alone(text: str) -> None:
    span = parts(text=text)
    Redactor().apply(span, {})
    assert span.attributes["text"] == text


def test_every_text_of_a_span_is_redacted() -> None:
    counts: dict[str, int] = {}
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "I am a@b.io"}]}])
    span = parts(**{"gen_ai.input.messages": messages, "emails": ["x@y.com", "fine"]})
    Redactor().apply(span, counts)
    assert span.name == "mail [REDACTED:email]"
    assert span.status_message == "key [REDACTED:api_key] leaked"
    assert json.loads(span.attributes["gen_ai.input.messages"])[0]["parts"][0]["content"] == (
        "I am [REDACTED:email]"
    )
    assert span.attributes["emails"] == ["[REDACTED:email]", "fine"]
    assert span.events[0][2] == {"msg": "ping [REDACTED:email]"}
    assert span.links[0][2] == {"k": "[REDACTED:api_key]"}
    assert counts == {"email": 4, "api_key": 2}


def test_custom_patterns_and_attribute_lists() -> None:
    redactor = Redactor(
        rules=(),
        patterns={"ticket": r"TICKET-\d+"},
        allow=["gen_ai.*", "keep.*", "host"],
        deny=["keep.secret*"],
    )
    counts: dict[str, int] = {}
    span = parts(**{"gen_ai.x": "see TICKET-42", "keep.a": 1, "keep.secret_b": 2, "other": 3})
    redactor.apply(span, counts)
    assert span.attributes == {"gen_ai.x": "see [REDACTED:ticket]", "keep.a": 1}
    assert span.resource_attributes == {"host": "h"}
    assert span.events[0][2] == {} and span.links[0][2] == {}
    assert counts == {"attribute": 4, "ticket": 1}
    assert span.name == "mail bob@corp.io"  # no built-in rules configured


def test_bad_configuration_is_named() -> None:
    with pytest.raises(ValueError, match="unknown redaction rules"):
        Redactor(rules=("phone",))
    with pytest.raises(ValueError, match="'broken' is not a regex"):
        Redactor(patterns={"broken": "("})


def test_luhn() -> None:
    assert luhn_valid("4111 1111 1111 1111")
    assert not luhn_valid("4111 1111 1111 1112")
    assert not luhn_valid("4111")


def may_match(redactor: Redactor, payload: bytes) -> bool:
    """Whether the native path's scan found what a redaction pattern needs."""
    assert DECODER is not None and redactor.prefilter is not None
    hourly = HourlyColumns(decoder=DECODER)
    gates, digits = redactor.prefilter
    count = hourly.append_record(payload, gates=gates, digits=digits, topic="spans")
    assert count is not None, "the native path must read this payload for its scan to count"
    return any(found for c in hourly.native_hours.values() for _, _, found in c.steps)


def _payload(text: str, where: str) -> bytes:
    """One span holding ``text`` in one place, as OTLP protobuf."""
    fields: dict[str, object] = {"name": "n"}
    if where == "array":
        fields["attributes"] = {"list": ["a", text]}
    elif where == "event":
        fields["events"] = [{"name": "e", "time_unix_nano": 1, "attributes": {"m": text}}]
    elif where == "link":
        fields["links"] = [{"trace_id": "3" * 32, "span_id": "4" * 16, "attributes": {"m": text}}]
    elif where in ("name", "status_message"):
        fields[where] = text or "n"
    else:
        fields[where] = {"t": text}
    span = Span(
        trace_id="1" * 32,
        span_id="2" * 16,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        **fields,  # type: ignore[arg-type]
    )
    return encode_otlp_protobuf([span])


@BUILTIN_EXAMPLES
@pytest.mark.parametrize(
    "where",
    ["name", "status_message", "attributes", "resource_attributes", "array", "event", "link"],
)
def test_the_prefilter_lets_every_example_through(
    text: str, expected: str, rule: str, where: str
) -> None:
    """Wherever a secret sits in a span, its record's bytes are scanned in full."""
    redactor = Redactor()
    payload = _payload(text, where)
    assert may_match(redactor, payload)
    spans = decode_spans(payload, None, 1 << 20)
    counts: dict[str, int] = {}
    redactor.apply(spans[0], counts)
    assert counts.get(rule, 0) >= 1


def test_the_prefilter_passes_plain_records() -> None:
    redactor = Redactor()
    for text in ("hello world", "task-1 took 12 ms", "ids 1234 5678 90", "٣ apples"):
        assert not may_match(redactor, _payload(text, "attributes")), text


def test_each_gate_is_found_wherever_it_sits_and_only_whole() -> None:
    """The scan stops at each gate's least common byte (``_`` of ``ghp_``, ``B`` of
    ``Bearer``), not its first, and looks back from there: a gate at a text's very start or
    end, or after longer characters, is found; one whose head lies outside the text is not."""
    redactor = Redactor()
    assert redactor.prefilter is not None
    gates, _ = redactor.prefilter
    for literal, table, need in gates:
        gate = literal.decode()
        # A letter that may follow (digits would make a run the card rule scans for).
        letter = next(chr(c) for c in range(256) if table[c] and chr(c).isalpha()) if need else ""
        follow = letter * need
        for text in (gate + follow, "x " + gate + follow, "\u00e9\U0001f600" + gate + follow):
            assert may_match(redactor, _payload(text, "attributes")), text
        # The literal without its first character, at the start of the text.
        assert not may_match(redactor, _payload(gate[1:] + follow, "attributes")), gate
        if need:  # one character short of what must follow, at the text's end
            assert not may_match(redactor, _payload(gate + follow[1:], "attributes")), gate


def test_custom_patterns_are_never_prefiltered(tmp_path: Path) -> None:
    """A pattern with nothing to scan for: every record takes the steps, none the native path."""
    redactor = Redactor(patterns={"ticket": r"TICKET-\d+"})
    assert redactor.prefilter is None
    config = ProcessingConfig(store_url=str(tmp_path), redact_patterns={"ticket": r"TICKET-\d+"})
    assert BatchProcessor(config)._native is None


# Pieces that make up lookalikes and real secrets, near misses included.
PIECES = [
    "4", "5", "1", "0", "9", " ", "-", "\u0661", "\u0664", "\uff11", "@", ".", "a", "Z", "x",
    "sk", "k-", "AKIA", "hf_", "ghp_", "earer ", "Bearer ", "\u00e9", "\U0001f600", "io", "_",
    "4111 1111 1111 1111", "378282246310005", "abcdefghijklmnop1234", "QRSTUVWXYZ012345",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
    st.sampled_from(
        ["name", "status_message", "attributes", "resource_attributes", "array", "event", "link"]
    ),
)
def test_a_record_the_prefilter_passes_holds_nothing_to_redact(text: str, where: str) -> None:
    redactor = Redactor()
    payload = _payload(text, where)
    spans = decode_spans(payload, None, 1 << 20)
    counts: dict[str, int] = {}
    redactor.apply(spans[0], counts)
    if counts:
        assert may_match(redactor, payload), (text, counts)


def _json_text(text: str, escape: str) -> str:
    """``text`` as the one string of a JSON array, each character that ``escape`` picks
    written as a ``\\u`` escape (two for a character beyond the first plane)."""

    def written(position: int, char: str) -> str:
        picked = {
            "none": char in '"\\' or char < " ",
            "all": True,
            "even": position % 2 == 0,
            "non-ascii": not char.isascii(),
        }[escape]
        if not picked:
            return char
        units = char.encode("utf-16-be")
        return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))

    return '["' + "".join(written(i, c) for i, c in enumerate(text)) + '"]'


def test_a_json_text_is_scanned_as_decoded() -> None:
    """Redaction matches a JSON document's strings as decoded: an address whose "@" is
    written "\\u0040" in a message JSON is redacted on the native path as on the authority."""
    redactor = Redactor()
    for text, rule in (("bob@example.org", "email"), ("sk-" + "a" * 24, "api_key")):
        document = _json_text(text, "all")
        assert "@" not in document and "sk-" not in document
        assert may_match(redactor, _payload(document, "attributes")), document
        spans = decode_spans(_payload(document, "attributes"), None, 1 << 20)
        counts: dict[str, int] = {}
        redactor.apply(spans[0], counts)
        assert counts == {rule: 1}
    # Plain text that merely holds escapes is matched as written, so scanned as written.
    assert not may_match(redactor, _payload("bob\\u0040example.org", "attributes"))
    assert not may_match(redactor, _payload('["ids \\u0031 and \\ud83d\\ude00"]', "event"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(PIECES), max_size=30).map("".join),
    st.sampled_from(["none", "all", "even", "non-ascii"]),
    st.sampled_from(["attributes", "resource_attributes", "array", "event", "link"]),
)
def test_a_json_text_the_prefilter_passes_holds_nothing_to_redact(
    text: str, escape: str, where: str
) -> None:
    redactor = Redactor()
    payload = _payload(_json_text(text, escape), where)
    spans = decode_spans(payload, None, 1 << 20)
    counts: dict[str, int] = {}
    redactor.apply(spans[0], counts)
    if counts:
        assert may_match(redactor, payload), (text, escape, counts)


def test_without_the_extension_every_record_goes_through_the_patterns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spanmill import native

    monkeypatch.setattr(native, "module", None)
    redactor = Redactor()
    assert redactor.prefilter is None
    span = parts()
    counts: dict[str, int] = {}
    redactor.apply(span, counts)
    assert counts == {"email": 2, "api_key": 2}


@pytest.mark.parametrize("native", [True, False], ids=["native", "steps"])
def test_a_denied_foreign_key_is_never_stored_translated(tmp_path: Path, native: bool) -> None:
    """The deny list named OpenLLMetry's prompt keys, and translation ran first: the
    prompt's text was moved into gen_ai.input.messages, which the list does not name,
    and stored with the SSN the operator meant to keep out."""
    from spanmill.collector.batch import BatchJob
    from spanmill.store import SpanStore
    from spanmill.store.layout import BatchId

    span = Span(
        trace_id="1" * 32, span_id="2" * 16, name="openai.chat",
        start_time_unix_nano=1_750_000_000_000_000_000,
        end_time_unix_nano=1_750_000_000_500_000_000,
        attributes={
            "gen_ai.system": "openai", "llm.request.type": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "my SSN is 078-05-1120",
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "Noted.",
        },
    )  # fmt: skip
    config = ProcessingConfig(
        store_url=str(tmp_path / "store"), attributes_deny=("gen_ai.prompt.*",)
    )
    processor = BatchProcessor(config, native=native)
    outcome = processor.process(
        BatchJob(
            BatchId("spans", 0, 0, 0, "0" * 16), [0], [0], [encode_otlp_protobuf([span])], [None]
        )
    )
    assert outcome.spans == 1 and not outcome.dead
    (stored,) = SpanStore(str(tmp_path / "store")).spans()
    assert "078-05-1120" not in json.dumps(stored.model_dump(mode="json"))
    assert not [key for key in stored.attributes if key.startswith("gen_ai.prompt.")]
    assert "Noted." in stored.attributes["gen_ai.output.messages"]  # the rest translated
    assert outcome.redactions["attribute"] == 2


def test_secrets_inside_json_messages_are_redacted_and_the_json_still_parses() -> None:
    """The patterns ran over the messages' JSON text: after a "\\n" escape the email rule
    took its "n" ("\\[REDACTED:email]": JSON that no longer parses, the sample lost),
    and a key right after one was missed (the "n" before it is a word character)."""
    messages = [
        {"role": "user", "parts": [{"type": "text", "content": "Contact me:\nalice@example.com"}]},
        {"role": "user", "parts": [{"type": "text",
                                    "content": "my key:\nsk-proj-abcdefghijklmnopqrstuvwx"}]},
        {"role": "user", "parts": [{"type": "text", "content": "caf\u00e9 bob@corp.io"}]},
    ]  # fmt: skip
    for ascii_only in (True, False):
        text = json.dumps(messages, ensure_ascii=ascii_only)
        span = parts(**{"gen_ai.input.messages": text, "plain": "x"})
        counts: dict[str, int] = {}
        Redactor().apply(span, counts)
        stored = json.loads(span.attributes["gen_ai.input.messages"])
        contents = [message["parts"][0]["content"] for message in stored]
        assert contents == [
            "Contact me:\n[REDACTED:email]",
            "my key:\n[REDACTED:api_key]",
            "caf\u00e9 [REDACTED:email]",
        ], contents
        assert counts["email"] >= 2 and counts["api_key"] >= 1
    # JSON with nothing to redact is left as it came, byte for byte.
    clean = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}], indent=1)
    span = parts(**{"gen_ai.input.messages": clean})
    Redactor().apply(span, {})
    assert span.attributes["gen_ai.input.messages"] == clean
