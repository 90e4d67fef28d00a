"""Redaction rules: built-in patterns, custom ones, and attribute allow and deny lists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanmill.collector.batch import BatchProcessor, ProcessingConfig
from spanmill.collector.decode import decode_spans
from spanmill.collector.redact import Redactor, luhn_valid, required_digits, required_literals
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


def assert_scan_covers(redactor: Redactor, payload: bytes, *context: object) -> None:
    """Where the authority's redaction changes anything in the record, the native scan
    found what the patterns need: the scan passes over nothing that holds a secret."""
    spans = decode_spans(payload, None, 1 << 20)
    counts: dict[str, int] = {}
    redactor.apply(spans[0], counts)
    if counts:
        assert may_match(redactor, payload), (*context, counts)


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


def test_a_custom_pattern_is_scanned_for_by_the_literal_its_matches_hold(tmp_path: Path) -> None:
    """``TICKET-\\d+`` needs ``TICKET-``: the native path reads records and stops only those
    that hold it; with a pattern that has neither a literal nor a digit to be sure of
    (``[a-z]{9}``), the native path still reads every record, and marks each as found:
    all take the patterns."""
    redactor = Redactor(patterns={"ticket": r"TICKET-\d+"})
    assert redactor.prefilter is not None
    assert (b"TICKET-", bytes(256), 0) in redactor.prefilter[0]
    assert may_match(redactor, _payload("see TICKET-42", "event"))
    assert not may_match(redactor, _payload("see TICKET 42, ticket-42", "event"))
    config = ProcessingConfig(store_url=str(tmp_path), redact_patterns={"ticket": r"TICKET-\d+"})
    assert BatchProcessor(config)._native is not None
    for unsure in (r"[a-z]{9}", r"(?i)kiss", "x*"):
        assert Redactor(patterns={"id": unsure}).prefilter is None, unsure
        config = ProcessingConfig(store_url=str(tmp_path), redact_patterns={"id": unsure})
        native = BatchProcessor(config)._native
        assert native is not None, unsure
        _, gates, digits, _, _ = native
        assert (gates, digits) == ((), -1)
        hourly = HourlyColumns(decoder=DECODER)
        assert hourly.append_record(_payload("hi", "event"), gates=gates, digits=digits) == 1
        assert [found for c in hourly.native_hours.values() for *_, found in c.steps] == [True]


def test_the_letters_that_ignoring_case_matches_beyond_ascii_are_left_out() -> None:
    """Every ASCII character that a character beyond ASCII matches where case is ignored
    is one the literals of a case-blind pattern never hold: the scan reads bytes as
    written, and would pass over "\u212aey" (the Kelvin sign) for a gate "key"."""
    from re import _casefix  # type: ignore[attr-defined]

    from spanmill.collector.redact import _FOLDS_BEYOND_ASCII

    reached = set()
    for code in range(128, 0x110000):
        char = chr(code)
        for other in (char.lower(), char.upper()):
            if len(other) == 1 and other.isascii():
                reached |= {other.lower(), other.upper()}
    for code, others in _casefix._EXTRA_CASES.items():
        if code < 128 and any(other >= 128 for other in others):
            reached |= {chr(code).lower(), chr(code).upper()}
    assert reached == set(_FOLDS_BEYOND_ASCII)
    for char in reached:  # and the regex engine agrees
        assert any(re.fullmatch(f"(?i){char}", chr(c)) for c in range(128, 0x3000)), char


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        (r"\bEMP-\d{6}\b", ("EMP-",)),
        (r"^\d{3}-\d{2}-\d{4}$", ("-",)),
        (r"(?:foo|bar)baz+", ("bar", "foo")),  # two of three letters beat "ba"
        (r"[Bb]earer", ("earer",)),
        (r"x{0,3}yz", ("yz",)),  # x may be absent
        (r"(?=abc)d", ("d",)),  # a lookahead's text is not part of the match
        (r"a(?i:b)c", ("a",)),  # "b" may be "B"
        (r"(ab|cd)e+", ("ab", "cd")),
        (r"(ab|)z", ("z",)),  # an empty branch requires nothing
        (r"(?>sec)ret", ("sec",)),
        (r"(?i)secret", tuple(sorted({a + b + c for a in "eE" for b in "cC" for c in "rR"}))),
        (r"(?i)x(?-i:KEY)", ("KEY",)),
        (r"(?i)kiss", ()),  # each letter also matches one beyond ASCII
        (r"(?i)[:=]k[ab]", (":", "=")),  # a class with no letter keeps its case
        (r"\d{9}", ()),
        (r"[a-z]+@", ("@",)),
        (r"(a|b|c|d|e|f|g|h|i)", ()),  # too many to be worth a scan
    ],
)
def test_the_literals_a_custom_pattern_requires(pattern: str, literals: tuple[str, ...]) -> None:
    assert required_literals(re.compile(pattern)) == literals


# Regexes built from pieces: literals (ASCII and not), classes, groups, alternations,
# repeats of every kind, anchors, lookarounds and case-blind groups.
_ATOMS = st.one_of(
    st.sampled_from(["a", "b", "-", "@", "K", "\u00e9", "ab", "-K", "\\.", "wor", "s", "I"]),
    st.sampled_from(["\\d", "[ab]", "[^a]", ".", "\\w"]),
    st.sampled_from(["\\b", "^", "$", "(?=a)", "(?!b)", "(?<=a)"]),
)


def _regexes() -> st.SearchStrategy[str]:
    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        sequence = st.lists(inner, min_size=2, max_size=4).map("".join)
        repeat = st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,3}?", "++"]))
        return st.one_of(
            sequence,
            sequence,
            sequence,
            st.lists(inner, min_size=2, max_size=3).map(lambda b: "(?:" + "|".join(b) + ")"),
            repeat.map(lambda t: f"(?:{t[0]}){t[1]}"),
            repeat.map(lambda t: f"(?:{t[0]}){t[1]}"),
            inner.map(lambda r: f"({r})"),
            inner.map(lambda r: f"(?>{r})"),
            inner.map(lambda r: f"(?i:{r})") | inner.map(lambda r: f"{r}(?i:K)"),
        )

    return st.recursive(_ATOMS, grow, max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_match_of_a_custom_pattern_holds_one_of_its_literals(data: st.DataObject) -> None:
    """Sound, as the scan must be: a text where the pattern matches holds one of the
    literals (inside the match), so no record that holds a match is passed over."""
    pattern = re.compile(data.draw(_regexes(), label="pattern"))
    literals = required_literals(pattern)
    text = data.draw(st.from_regex(pattern), label="text")
    for match in pattern.finditer(text):
        if match.group():
            assert not literals or any(lit in match.group() for lit in literals), literals


@pytest.mark.parametrize(
    ("pattern", "digits"),
    [
        (r"^\d{3}-\d{2}-\d{4}$", 9),
        (r"\d{3}[ -]?\d{3}", 6),
        (r"(\d{3})-(\d{2})", 5),
        (r"[0-9]{4}", 4),
        (r"\d{3}-\d{0,2}-\d{4}", 4),  # "123--4567": two dashes end a run
        (r"\d{3}--\d{2}", 3),
        (r"\d{3}\.\d{3}", 3),  # a dot ends a run
        (r"[a-z]+", 0),
        (r"\d*", 0),
    ],
)
def test_the_digits_a_custom_pattern_requires(pattern: str, digits: int) -> None:
    assert required_digits(re.compile(pattern)) == digits


def _longest_run(text: str) -> int:
    """The longest run of decimal digits in ``text`` as the native scan counts them: a
    single space or dash may stand between two digits."""
    best = run = 0
    separated = False
    for char in text:
        if char.isdecimal():
            run, separated = run + 1, False
            best = max(best, run)
        elif char in " -" and run and not separated:
            separated = True
        else:
            run, separated = 0, False
    return best


_DIGIT_ATOMS = st.sampled_from(
    ["\\d", "[0-9]", "[2-6]", "7", "-", " ", "[ -]", "a", "\\b", "^", "(?=\\d)"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_match_of_a_custom_pattern_holds_its_run_of_digits(data: st.DataObject) -> None:
    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        repeat = st.tuples(inner, st.sampled_from(["*", "+", "?", "{3}", "{0,2}", "{2,4}?"]))
        sequence = st.lists(inner, min_size=2, max_size=5).map("".join)
        return st.one_of(sequence, sequence, repeat.map(lambda t: f"(?:{t[0]}){t[1]}"),
                         inner.map(lambda r: f"({r})"),
                         st.lists(inner, min_size=2, max_size=2).map("|".join).map(
                             lambda r: f"(?:{r})"))  # fmt: skip

    pattern = re.compile(data.draw(st.recursive(_DIGIT_ATOMS, grow, max_leaves=10)))
    digits = required_digits(pattern)
    text = data.draw(st.from_regex(pattern), label="text")
    for match in pattern.finditer(text):
        if match.group():
            assert _longest_run(match.group()) >= digits, (pattern.pattern, digits)


def test_a_custom_pattern_of_digits_is_scanned_for_as_a_run() -> None:
    """An SSN's literals are dashes, which most spans hold (``gpt-4o``): the scan looks for
    its run of nine digits instead, and passes over a record with a model name."""
    redactor = Redactor(rules=(), patterns={"ssn": r"^\d{3}-\d{2}-\d{4}$"})
    assert redactor.prefilter == ((), 9)
    assert not may_match(redactor, _payload("gpt-4o on 2026-12-07", "attributes"))
    assert may_match(redactor, _payload("078-05-1120", "attributes"))
    assert may_match(redactor, _payload("\u0660\u0667\u0668-05-1120", "event"))


def test_an_anchored_custom_pattern_redacts_whole_values(tmp_path: Path) -> None:
    """``^...$`` is a value that is nothing but the thing: such a value is redacted wherever
    it sits (an attribute, a message's text, an event), and one that merely holds it is
    not. The rules a span needed were decided on its texts joined, where the anchors only
    ever met the span's name, so nothing was ever redacted."""
    patterns = {"ssn": r"^\d{3}-\d{2}-\d{4}$"}
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "078-05-1120"}]}])
    span = parts(**{"user.ssn": "078-05-1120", "note": "ssn 078-05-1120",
                    "gen_ai.input.messages": messages})  # fmt: skip
    span.events = [("log", 1, {"ssn": "219-09-9999"})]
    counts: dict[str, int] = {}
    Redactor(rules=(), patterns=patterns).apply(span, counts)
    assert span.attributes["user.ssn"] == "[REDACTED:ssn]"
    assert span.attributes["note"] == "ssn 078-05-1120"
    assert "078-05-1120" not in span.attributes["gen_ai.input.messages"]
    assert span.events[0][2] == {"ssn": "[REDACTED:ssn]"}
    assert counts == {"ssn": 3}
    # Through the collector's batch processor, on the native path and the authority's.
    from spanmill.collector.batch import BatchJob
    from spanmill.store import SpanStore
    from spanmill.store.layout import BatchId

    record = encode_otlp_protobuf([Span(
        trace_id="1" * 32, span_id="2" * 16, name="lookup",
        start_time_unix_nano=1_750_000_000_000_000_000,
        end_time_unix_nano=1_750_000_000_500_000_000,
        attributes={"user.ssn": "078-05-1120", "model": "gpt-4o"},
    )])  # fmt: skip
    # The SSN's run of digits is scanned for; "^[0-9-]+$" leaves nothing to scan for.
    for name, pattern in (("ssn", patterns["ssn"]), ("digits", r"^[0-9-]{11}$")):
        for native in (True, False):
            store = tmp_path / f"store-{name}-{native}"
            processor = BatchProcessor(
                ProcessingConfig(store_url=str(store), redact_patterns={name: pattern}),
                native=native,
            )
            assert (processor._native is not None) == native
            job = BatchJob(BatchId("spans", 0, 0, 0, "0" * 16), [0], [0], [record], [None])
            outcome = processor.process(job)
            assert outcome.spans == 1 and outcome.redactions == {name: 1}, (name, native)
            (stored,) = SpanStore(str(store)).spans()
            assert stored.attributes["user.ssn"] == f"[REDACTED:{name}]"
            assert stored.attributes["model"] == "gpt-4o"


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
    assert_scan_covers(redactor, payload, text)


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
    assert_scan_covers(redactor, payload, text, escape)


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


# What JSON writes as an escape, next to or inside a secret: a newline before a key (the
# "n" of "\n" is a word character), a quote, a backslash, a card in Arabic-Indic digits.
_JSON_PIECES = [*PIECES, "\n", '"', "\\", "4" + "\u0661" * 15, "\nsk-" + "a" * 20]
_JSON_VALUES = st.recursive(
    st.one_of(
        st.lists(st.sampled_from(_JSON_PIECES), max_size=8).map("".join),
        st.integers(min_value=0, max_value=10**19),
        st.none(),
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.lists(st.sampled_from(PIECES), max_size=4).map("".join), inner, max_size=3
        )
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_JSON_VALUES, min_size=1, max_size=3),
    st.sampled_from([(",", ":"), (", ", ": ")]),
    st.booleans(),
    st.lists(st.sampled_from(PIECES), max_size=6).map("".join),
)
def test_rules_chosen_on_json_as_written_redact_what_its_strings_need(
    documents: list[object], separators: tuple[str, str], ascii_only: bool, plain: str
) -> None:
    """Which built-in rules a span needs is decided on a JSON text without escapes as it
    was written, unparsed: the span comes out as when each of its strings was read on its
    own (keys and numbers that look like secrets included, which are left as they are)."""
    texts = [json.dumps(d, separators=separators, ensure_ascii=ascii_only) for d in documents]
    attributes = {f"doc{i}": text for i, text in enumerate(texts)}
    attributes["plain"] = "[" + plain  # looks like JSON, is not
    results = []
    for walk in (True, False):
        # Nothing else in the span for a rule to find.
        span = SpanParts("1" * 32, "2" * 16, None, "n", "client", 1, 2, "ok", "", dict(attributes),
                         {}, "", "", [("log", 1, {"doc": texts[0]})], [])  # fmt: skip
        redactor = Redactor()
        redactor._walk_documents = walk  # True: every JSON text parsed, as before
        counts: dict[str, int] = {}
        redactor.apply(span, counts)
        results.append((span.attributes, span.events, counts))
    assert results[0] == results[1]


CUSTOM = {"emp": r"\bEMP-\d{6}\b", "ssn": r"^\d{3}-\d{2}-\d{4}$", "token": r"(?:tok|key)_[a-z]{8}",
          "phone": r"\(?\d{3}\)?[ -]?\d{3}[ -]?\d{4}", "password": r"(?i)password=\S+",
          "api": r"(?i)api_key=\w+"}  # fmt: skip
CUSTOM_PIECES = ["EMP-", "EM", "P-", "123456", "078-05-1120", "tok_", "key_", "abcdefgh", " ",
                 "-", "\u0661", "\u00e9", "x", "_", "555 123 4567", "(555)", "12",
                 "\u0663", "PassWord=", "password", "=", "API_\u212aEY=", "api_key",
                 "\u017f"]  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(CUSTOM_PIECES), max_size=12).map("".join),
    st.sampled_from(["text", "none", "all", "even"]),
    st.sampled_from(["name", "status_message", "attributes", "array", "event", "link"]),
)
def test_a_record_the_scan_for_custom_patterns_passes_holds_nothing_to_redact(
    text: str, escape: str, where: str
) -> None:
    """The native scan for custom patterns' literals finds every record the patterns would
    change, a JSON text's escaped strings included."""
    redactor = Redactor(rules=(), patterns=CUSTOM)
    if escape != "text" and where not in ("name", "status_message"):
        text = _json_text(text, escape)
    payload = _payload(text, where)
    assert_scan_covers(redactor, payload, text)


def test_the_deny_list_before_translation_drops_a_name_every_time_it_comes() -> None:
    """The names found not denied are remembered, the denied ones are not: a span whose
    names were all seen before and not denied is passed at once, and a denied name is
    dropped from every span that brings it, however often it comes."""
    redactor = Redactor(rules=(), deny=["gen_ai.prompt.*"])
    for _ in range(3):
        counts: dict[str, int] = {}
        span = parts(**{"gen_ai.prompt.0.content": "secret", "gen_ai.system": "openai"})
        redactor.deny_before_translation(span, counts)
        assert span.attributes == {"gen_ai.system": "openai"}
        assert counts == {"attribute": 1}
        plain = parts(**{"gen_ai.system": "openai"})
        redactor.deny_before_translation(plain, counts)
        assert plain.attributes == {"gen_ai.system": "openai"} and counts == {"attribute": 1}
