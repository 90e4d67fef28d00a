"""Redaction, applied to every span before anything is written to the store.

Two kinds of rule, both configured on the collector (see
:class:`~spanmill.config.CollectorSettings`):

- *Patterns* replace what they match in every text a span carries — its name,
  status message, and each string attribute of the span, its resource, events and
  links (message JSON included) — with ``[REDACTED:<rule>]``. Built in:
  ``email``, ``api_key`` (OpenAI/Anthropic-style ``sk-`` keys, AWS access key
  ids, GitHub, Slack, Google and Hugging Face tokens, bearer tokens) and
  ``card_number`` (13 to 19 digits that pass the Luhn check). Custom patterns are
  regular expressions.
- *Attribute lists* drop whole attributes by name: an allow list (when set, only
  matching names are kept) and a deny list, both of shell-style globs such as
  ``http.request.header.*``.

Most spans hold nothing any rule can match. Every built-in pattern needs one of
its literal *gates* (followed by enough characters of a set), or a run of digits,
to occur in a text. The native decoder looks for those in the texts as it reads
them (:attr:`Redactor.prefilter` says what to look for), and a record where none
occurs skips the patterns altogether.

The dead-letter topic keeps the original bytes of what it refuses, unredacted:
give it the same access controls as the span topic.
"""

from __future__ import annotations

import fnmatch
import json
import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spanmill import native
from spanmill.store.rows import SpanParts

_JOIN: Final = "\x1f"  # a separator no rule's pattern can match across


def luhn_valid(text: str) -> bool:
    digits = [int(char) for char in text if char.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


@dataclass(frozen=True)
class Rule:
    """One pattern: cheap substrings that must occur first, then the regex, then checks.

    A regex that starts with a literal is scanned for fast; these keep it that way:
    ``lead``, characters one of which must come right before the match and is
    replaced with it; ``boundary``, no word character before the match (what a
    leading ``\\b`` says); ``check``, a test of the matched text, for matches that
    do not start inside a longer number.

    What every match holds, for the byte-level prefilter: a gate followed by at
    least ``follow_min`` characters of ``follow`` (ASCII); or, for a rule without
    gates, a run of ``digits`` decimal digits, a single space or dash allowed
    between two.
    """

    name: str
    pattern: re.Pattern[str]
    gates: tuple[str, ...] = ()
    check: Callable[[str], bool] | None = None
    boundary: bool = False
    lead: str = ""
    follow: str = ""
    follow_min: int = 0
    digits: int = 0
    replacement: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replacement", f"[REDACTED:{self.name}]")

    @property
    def plain(self) -> bool:
        return self.check is None and not self.boundary and not self.lead

    def _found(self, text: str) -> Iterator[tuple[int, int]]:
        """Where the matches to replace lie, left to right, not overlapping."""
        search, position = self.pattern.search, 0
        while (match := search(text, position)) is not None:
            found, end = match.span()
            start = found
            if self.lead:
                if not start or text[start - 1] not in self.lead:
                    position = found + 1
                    continue
                start -= 1
            before = text[start - 1] if start else ""
            if self.boundary and (before.isalnum() or before == "_"):
                # A match may begin later inside this one, after a boundary.
                position = found + 1
                continue
            position = max(end, found + 1)
            if self.check is not None:
                if before.isdigit() or before == "-":
                    continue  # the middle of a longer number
                if not self.check(text[start:end]):
                    continue
            yield start, end

    def _gated_out(self, text: str) -> bool:
        """Whether ``text`` holds none of the rule's gates, so no match (a rule without
        gates says False)."""
        if not self.gates:
            return False
        for gate in self.gates:  # a loop: all() over a generator costs three times as much
            if gate in text:
                break
        else:
            return True
        return False

    def may_match(self, text: str) -> bool:
        if self._gated_out(text):
            return False
        if self.plain:
            return self.pattern.search(text) is not None
        return next(self._found(text), None) is not None

    def sub(self, text: str) -> tuple[str, int]:
        if self._gated_out(text):  # most texts of a span hold none of a rule's gates
            return text, 0
        if self.plain:
            return self.pattern.subn(self.replacement, text)
        pieces: list[str] = []
        last = 0
        for start, end in self._found(text):
            pieces += (text[last:start], self.replacement)
            last = end
        if not pieces:
            return text, 0
        pieces.append(text[last:])
        return "".join(pieces), len(pieces) // 2


_ALNUM: Final = string.ascii_letters + string.digits


def _key(pattern: str, *gates: str, follow: str = "", at_least: int = 0, lead: str = "") -> Rule:
    return Rule(
        "api_key",
        re.compile(pattern),
        gates=gates,
        boundary=True,
        lead=lead,
        follow=follow,
        follow_min=at_least,
    )


# Each rule name stands for one or more patterns. The API-key forms are separate
# patterns, each starting with its literal and gated on it: one alternation of them
# all cannot be scanned for fast, and ids such as "task-1" open the "k-" gate often.
BUILTIN_RULES: Final[dict[str, tuple[Rule, ...]]] = {
    "email": (
        Rule(
            "email",
            re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
            gates=("@",),
            # After the @: a label, then at least ".xx".
            follow=_ALNUM + ".-",
            follow_min=4,
        ),
    ),
    "api_key": (
        # First: a bearer token is replaced whole, whatever key it holds.
        _key(r"[Bb]earer\s+[A-Za-z0-9._~+/-]{20,}=*", "Bearer", "bearer"),
        # OpenAI/Anthropic-style secret, publishable and restricted keys.
        _key(r"k-[A-Za-z0-9_-]{16,}", "k-", follow=_ALNUM + "_-", at_least=16, lead="spr"),
        _key(
            r"A(?:KIA|SIA)[0-9A-Z]{16}\b",
            "AKIA",
            "ASIA",
            follow=string.ascii_uppercase + string.digits,
            at_least=16,
        ),
        _key(
            r"gh[pousr]_[A-Za-z0-9]{30,}",
            *("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
            follow=_ALNUM,
            at_least=30,
        ),
        _key(r"github_pat_[A-Za-z0-9_]{30,}", "github_pat_", follow=_ALNUM + "_", at_least=30),
        # [abprs] and the dash count among the characters that follow "xox".
        _key(r"xox[abprs]-[A-Za-z0-9-]{10,}", "xox", follow=_ALNUM + "-", at_least=12),
        _key(r"AIza[0-9A-Za-z_-]{35}", "AIza", follow=_ALNUM + "_-", at_least=35),
        _key(r"hf_[A-Za-z0-9]{30,}", "hf_", follow=_ALNUM, at_least=30),
    ),
    # Issuer digits 2-6 leave out nanosecond timestamps and most other long numbers.
    # The pattern starts with a character class so the regex engine can skip ahead
    # fast; that it does not start inside a longer number is checked afterwards.
    "card_number": (
        Rule(
            "card_number",
            re.compile(r"[2-6]\d(?:[ -]?\d){11,17}(?!\d)"),
            check=luhn_valid,
            digits=13,
        ),
    ),
}
DEFAULT_RULES: Final = ("email", "api_key", "card_number")


# Gates (literal, a table of the 256 bytes: 1 where it may follow, how many must)
# and the length of a digit run.
Prefilter = tuple[tuple[tuple[bytes, bytes, int], ...], int]


def _globs(patterns: Sequence[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(fnmatch.translate(pattern) for pattern in patterns))


class Redactor:
    """Applies the configured patterns and attribute lists to spans, in place."""

    def __init__(
        self,
        rules: Sequence[str] = DEFAULT_RULES,
        patterns: Mapping[str, str] | None = None,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
    ) -> None:
        unknown = [name for name in rules if name not in BUILTIN_RULES]
        if unknown:
            raise ValueError(
                f"unknown redaction rules {unknown}; built in: {sorted(BUILTIN_RULES)}"
            )
        self.rules = [rule for name in rules for rule in BUILTIN_RULES[name]]
        for name, pattern in (patterns or {}).items():
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"redaction pattern {name!r} is not a regex: {exc}") from None
            self.rules.append(Rule(name, compiled))
        self._allow = _globs(allow)
        self._deny = _globs(deny)
        # The names keeps() has judged: whether each is kept (the native decoder reads
        # this dict, and leaves a record with a name not in it to the authority), and the
        # kept ones as a set, for one superset test per attribute map.
        self.verdicts: dict[str, bool] = {}
        self._kept: set[str] = set()
        self._prefilter = _prefilter(self.rules)

    @property
    def prefilter(self) -> Prefilter | None:
        """What every pattern's match needs, for the native decoder to look for; None: no test.

        A custom pattern has no gates, and without the C extension nothing looks:
        then every span's texts go through the patterns.
        """
        return self._prefilter

    @property
    def filters_keys(self) -> bool:
        return self._allow is not None or self._deny is not None

    def keeps(self, key: str) -> bool:
        """Whether an attribute of this name survives the allow and deny lists."""
        decision = self.verdicts.get(key)
        if decision is not None:
            return decision
        decision = (self._allow is None or self._allow.match(key) is not None) and (
            self._deny is None or self._deny.match(key) is None
        )
        if len(self.verdicts) > 100_000:
            # Names are few; this bounds a pathological producer.
            self.verdicts.clear()
            self._kept.clear()
        self.verdicts[key] = decision
        if decision:
            self._kept.add(key)
        return decision

    def judge(self, attributes: Mapping[str, Any]) -> None:
        """Give each of these names a verdict, without dropping anything."""
        if self.filters_keys and not self._kept.issuperset(attributes):
            for key in attributes:
                self.keeps(key)

    def deny_before_translation(self, parts: SpanParts, counts: dict[str, int]) -> None:
        """Drop the span's attributes the deny list names, as they came: a foreign
        convention's keys (gen_ai.prompt.*, llm.input_messages.*) are gone by the time
        :meth:`apply` runs, their content moved into the GenAI attributes translation
        writes. The allow list is applied after translation alone, to the stored names."""
        if self._deny is None:
            return
        deny = self._deny
        dropped = [key for key in parts.attributes if deny.match(key) is not None]
        if dropped:
            counts["attribute"] = counts.get("attribute", 0) + len(dropped)
            parts.attributes = {k: v for k, v in parts.attributes.items() if k not in dropped}

    def _filter(self, attributes: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
        if self._kept.issuperset(attributes):
            return attributes
        dropped = [key for key in attributes if not self.keeps(key)]
        if not dropped:
            return attributes
        counts["attribute"] = counts.get("attribute", 0) + len(dropped)
        kept = dict(attributes)
        for key in dropped:
            del kept[key]
        return kept

    def apply(self, parts: SpanParts, counts: dict[str, int], patterns: bool = True) -> None:
        """Redact in place; ``patterns=False`` applies the attribute lists alone.

        Pass False only where the decoder's scan for :attr:`prefilter` found nothing.
        """
        if self.filters_keys:
            parts.attributes = self._filter(parts.attributes, counts)
            parts.resource_attributes = self._filter(parts.resource_attributes, counts)
            if parts.events:
                parts.events = [(n, t, self._filter(a, counts)) for n, t, a in parts.events]
            if parts.links:
                parts.links = [(t, s, self._filter(a, counts)) for t, s, a in parts.links]
        if not self.rules or not patterns:
            return
        texts = [parts.name, parts.status_message]
        maps = [parts.attributes, parts.resource_attributes]
        maps.extend(a for _, _, a in parts.events)
        maps.extend(a for _, _, a in parts.links)
        # A JSON text (messages, a tool call's arguments) is matched and cleaned string by
        # string, as decoded: in its escaped form a pattern would take the "n" of a "\n"
        # into an address (leaving JSON that no longer parses) or miss a key after one.
        documents: dict[int, Any] = {}
        for attributes in maps:
            for value in attributes.values():
                kind = type(value)
                if kind is str:
                    document = _document(value)
                    if document is None:
                        texts.append(value)
                    else:
                        documents[id(value)] = document
                        texts.extend(_strings(document))
                elif kind is list and value and type(value[0]) is str:
                    texts.extend(value)
        joined = _JOIN.join(texts)
        hits = [rule for rule in self.rules if rule.may_match(joined)]
        if not hits:
            return

        def clean(text: str) -> str:
            for rule in hits:
                text, count = rule.sub(text)
                if count:
                    counts[rule.name] = counts.get(rule.name, 0) + count
            return text

        parts.name = clean(parts.name) or parts.name
        parts.status_message = clean(parts.status_message)
        # Resource dicts may be shared by the spans of one record: rebuild, never mutate.
        parts.attributes = _clean_map(parts.attributes, clean, documents)
        parts.resource_attributes = _clean_map(parts.resource_attributes, clean, documents)
        parts.events = [(n, t, _clean_map(a, clean, documents)) for n, t, a in parts.events]
        parts.links = [(t, s, _clean_map(a, clean, documents)) for t, s, a in parts.links]


def _prefilter(rules: Sequence[Rule]) -> Prefilter | None:
    """What one of which every rule's match needs, for the decoder; None if some has none.

    Each gate becomes (literal, table of the bytes that may follow, how many must);
    rules without gates give a run of digits.
    """
    if native.module is None or not rules:
        return None
    gates: dict[bytes, tuple[bytes, bytes, int]] = {}
    runs = []
    for rule in rules:
        if rule.gates and all(gate.isascii() for gate in rule.gates):
            table = bytes(256) if not rule.follow_min else _table(rule.follow)
            for gate in rule.gates:
                literal = gate.encode()
                spec = (literal, table, rule.follow_min)
                if literal in gates and gates[literal] != spec:
                    spec = (literal, bytes(256), 0)  # two rules, one gate: the literal alone
                gates[literal] = spec
        elif rule.digits:
            runs.append(rule.digits)
        else:
            return None
    return tuple(gates.values()), min(runs, default=0)


def _table(chars: str) -> bytes:
    allowed = bytearray(256)
    for char in chars:
        allowed[ord(char)] = 1  # ASCII only: a longer character's bytes never follow a gate
    return bytes(allowed)


def _clean_map(
    attributes: dict[str, Any], clean: Callable[[str], str], documents: Mapping[int, Any]
) -> dict[str, Any]:
    out = {}
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            document = documents.get(id(value))
            if document is None:
                value = clean(value)
            else:
                cleaned, changed = _clean_document(document, clean)
                if changed:
                    value = json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))
        elif kind is list and value and type(value[0]) is str:
            value = [clean(item) for item in value]
        out[key] = value
    return out


def _document(text: str) -> Any:
    """The JSON array or object ``text`` holds, or None: plain text, or not JSON."""
    if text[:1] not in ("[", "{"):
        return None
    try:
        return json.loads(text)
    except ValueError:  # RecursionError among them
        return None


def _strings(document: Any) -> Iterator[str]:
    """The strings of a JSON document, its values' (names are the producer's schema)."""
    if isinstance(document, str):
        yield document
    elif isinstance(document, list):
        for item in document:
            yield from _strings(item)
    elif isinstance(document, dict):
        for item in document.values():
            yield from _strings(item)


def _clean_document(document: Any, clean: Callable[[str], str]) -> tuple[Any, bool]:
    """``document`` with each string cleaned, and whether any changed."""
    if isinstance(document, str):
        cleaned = clean(document)
        return cleaned, cleaned != document
    if isinstance(document, list):
        items = [_clean_document(item, clean) for item in document]
        return [item for item, _ in items], any(changed for _, changed in items)
    if isinstance(document, dict):
        pairs = {key: _clean_document(item, clean) for key, item in document.items()}
        return {key: item for key, (item, _) in pairs.items()}, any(
            changed for _, changed in pairs.values()
        )
    return document, False
