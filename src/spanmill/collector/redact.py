"""Redaction, applied to every span before anything is written to the store.

Two kinds of rule, both configured on the collector (see
:class:`~spanmill.config.CollectorSettings`):

- *Patterns* replace what they match in every text a span carries — its name,
  status message, and each string attribute of the span, its resource, events and
  links (message JSON included) — with ``[REDACTED:<rule>]``. Built in:
  ``email``, ``api_key`` (OpenAI/Anthropic-style ``sk-`` keys, AWS access key
  ids, GitHub, Slack, Google and Hugging Face tokens, bearer tokens) and
  ``card_number`` (13 to 19 digits that pass the Luhn check). Custom patterns are
  regular expressions, each matched against every text on its own (``^...$`` is a
  whole value; a JSON document's strings one by one).
- *Attribute lists* drop whole attributes by name: an allow list (when set, only
  matching names are kept) and a deny list, both of shell-style globs such as
  ``http.request.header.*``.

Most spans hold nothing any rule can match. Every built-in pattern needs one of
its literal *gates* (followed by enough characters of a set), or a run of digits,
to occur in a text. The native decoder looks for those in the texts as it reads
them (:attr:`Redactor.prefilter` says what to look for), and a record where none
occurs skips the patterns altogether. A custom pattern's gates are the literals its
matches must hold, read from the regex (``EMP-`` of ``EMP-\\d{6}``), or the run of
digits they hold (:func:`required_digits`); a custom pattern with neither
(``[a-z]{9}``) leaves every record to the patterns.

The dead-letter topic keeps the original bytes of what it refuses, unredacted:
give it the same access controls as the span topic.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
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
    # Tried on each text alone when deciding which rules a span needs: a custom pattern
    # may be anchored (``^...$``, the whole value) or look around, and the texts joined
    # would hide its matches. The built-in ones cannot match across the separator.
    per_text: bool = False
    replacement: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replacement", f"[REDACTED:{self.name}]")

    @property
    def gates_scanned(self) -> bool:
        """Whether the native scan looks for this rule's gates (it reads ASCII ones only);
        if not, for its run of ``digits``; with neither, it can look for nothing."""
        return bool(self.gates) and all(gate.isascii() for gate in self.gates)

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


# The most gates the native decoder's scan looks for at once (``MAX_GATES`` in the C).
MAX_GATES: Final = 64
# The most literals one rule's gate may be one of (a character class, an alternation).
_MAX_CHOICES: Final = 8


def required_literals(pattern: re.Pattern[str]) -> tuple[str, ...]:
    """Literals, one of which every match of ``pattern`` holds: a custom pattern's gates.

    Read from the regex's parse: the longest run of literal characters that every match
    must pass through (inside groups, repeats of at least one, alternations whose every
    branch has one, small classes of literals). Where case is ignored, a stretch of the
    run with three letters at most, each in both cases (``wor``, ``WOR``, ``wOr``...),
    leaving out ``i``, ``k`` and ``s``, which also match letters beyond ASCII (U+0130,
    U+0131, the Kelvin sign, U+017F) that the scan would not see. Empty where there is
    none to be sure of (``\\d{9}``). Only what the match itself consumes counts;
    lookarounds and anchors add nothing.
    """
    try:
        found = _required(
            _parser.parse(pattern.pattern, pattern.flags), bool(pattern.flags & re.IGNORECASE)
        )
    except Exception:  # the interpreter's own parser, not a public interface: no gates
        return ()
    return tuple(sorted(found)) if found else ()


def _required(items: Any, fold: bool) -> frozenset[str] | None:
    """One of which strings every match of the sequence ``items`` holds; None: unknown.
    ``fold``: case is ignored."""
    best: frozenset[str] | None = None
    run: list[str] = []
    for op, argument in [*items, (None, None)]:
        if op is _c.LITERAL:
            run.append(chr(argument))
            continue
        for choice in (_literal("".join(run), fold) if run else None, _element(op, argument, fold)):
            if choice is not None and (best is None or _rank(choice) > _rank(best)):
                best = choice
        run = []
    return best


# ASCII letters that ignoring case also matches to letters beyond ASCII: i (U+0130,
# U+0131), k (the Kelvin sign, U+212A), s (the long s, U+017F).
_FOLDS_BEYOND_ASCII: Final = frozenset("iksIKS")
_MAX_FOLDED_LETTERS: Final = 3


def _literal(run: str, fold: bool) -> frozenset[str] | None:
    """A run of literal characters as what a match holds: itself, or where case is
    ignored every casing of its best stretch (see :func:`required_literals`)."""
    if not fold:
        return frozenset((run,))
    best = ""
    for first in range(len(run)):
        letters = 0
        for end in range(first, len(run)):
            char = run[end]
            if not char.isascii() or char in _FOLDS_BEYOND_ASCII:
                break
            letters += char.isalpha()
            if letters > _MAX_FOLDED_LETTERS:
                break
            if end + 1 - first > len(best):
                best = run[first : end + 1]
    if not best:
        return None
    casings = [(c.lower(), c.upper()) if c.isalpha() else (c,) for c in best]
    return frozenset("".join(chars) for chars in itertools.product(*casings))


def _rank(choice: frozenset[str]) -> tuple[int, int]:
    """Longer literals first, then fewer of them: what the scan stops at least."""
    return min(len(literal) for literal in choice), -len(choice)


def _element(op: Any, argument: Any, fold: bool) -> frozenset[str] | None:
    """What one element of a sequence that is not a literal requires."""
    if op is _c.SUBPATTERN:
        _, add_flags, del_flags, body = argument
        if add_flags & re.IGNORECASE:
            fold = True
        elif del_flags & re.IGNORECASE:
            fold = False
        return _required(body, fold)
    if op is _c.ATOMIC_GROUP:
        return _required(argument, fold)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        least, _, body = argument
        return _required(body, fold) if least >= 1 else None
    if op is _c.BRANCH:
        union: set[str] = set()
        for branch in argument[1]:
            required = _required(branch, fold)
            if required is None:
                return None
            union |= required
        return frozenset(union) if len(union) <= _MAX_CHOICES else None
    if (
        op is _c.IN
        and len(argument) <= _MAX_CHOICES
        and all(kind is _c.LITERAL for kind, _ in argument)
    ):
        chars = frozenset(chr(code) for _, code in argument)
        # Where case is ignored, a class holds what it lists only if nothing in it has case.
        if not fold or all(char.isascii() and not char.isalpha() for char in chars):
            return chars
    return None


def required_digits(pattern: re.Pattern[str]) -> int:
    """The longest run of decimal digits every match of ``pattern`` holds, a single space
    or dash allowed between two, as the native scan counts them (``\\d{3}-\\d{2}-\\d{4}``:
    9); 0 where none is sure."""
    try:
        items = _inlined(_parser.parse(pattern.pattern, pattern.flags))
    except Exception:  # the interpreter's own parser, not a public interface: no run
        return 0
    best = run = 0
    after_digit = False  # the element before was one digit at least
    for op, argument in items:
        digits = _digits(op, argument)
        if digits is not None:
            run += digits
            after_digit = digits > 0
        elif after_digit and _separator(op, argument):
            after_digit = False
        elif op not in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):  # those consume nothing
            run, after_digit = 0, False
        best = max(best, run)
    return best


def _inlined(items: Any) -> list[tuple[Any, Any]]:
    """A sequence with its groups' sequences laid out in it."""
    out: list[tuple[Any, Any]] = []
    for op, argument in items:
        if op is _c.SUBPATTERN:
            out += _inlined(argument[3])
        elif op is _c.ATOMIC_GROUP:
            out += _inlined(argument)
        else:
            out.append((op, argument))
    return out


def _is_digit_class(op: Any, argument: Any) -> bool:
    """A class of decimal digits alone: ``\\d``, ``[0-9]``, ``[2-6]``."""
    if op is not _c.IN or not argument:
        return False
    for kind, value in argument:
        if kind is _c.CATEGORY and value is _c.CATEGORY_DIGIT:
            continue
        if kind is _c.RANGE and ord("0") <= value[0] <= value[1] <= ord("9"):
            continue
        if kind is _c.LITERAL and ord("0") <= value <= ord("9"):
            continue
        return False
    return True


def _digits(op: Any, argument: Any) -> int | None:
    """How many digits at least an element of digits alone consumes; None: not such."""
    if _is_digit_class(op, argument) or (op is _c.LITERAL and ord("0") <= argument <= ord("9")):
        return 1
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        least, _, body = argument
        if len(body) == 1 and _digits(*body[0]) == 1:
            return int(least)
    return None


def _separator(op: Any, argument: Any) -> bool:
    """One space or dash, or none: what the scan lets stand between two digits."""
    if op is _c.LITERAL:
        return argument in (ord(" "), ord("-"))
    if op is _c.IN:
        return all(kind is _c.LITERAL and code in (ord(" "), ord("-")) for kind, code in argument)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        _, most, body = argument
        return most == 1 and len(body) == 1 and _separator(*body[0])
    return False


def _custom_rule(name: str, pattern: re.Pattern[str]) -> Rule:
    """A custom pattern as a rule, with what the scan may look for: the literals every
    match holds, or where those are single characters (a dash), a run of five digits or
    more if every match holds one: the scan stops at fewer texts."""
    gates, digits = required_literals(pattern), required_digits(pattern)
    if digits >= 5 and min(map(len, gates), default=0) < 2:
        gates = ()
    return Rule(name, pattern, gates=gates, digits=digits, per_text=True)


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
            self.rules.append(_custom_rule(name, compiled))
        self._allow = _globs(allow)
        self._deny = _globs(deny)
        # The names keeps() has judged: whether each is kept (the native decoder reads
        # this dict, and leaves a record with a name not in it to the authority), and the
        # kept ones as a set, for one superset test per attribute map.
        self.verdicts: dict[str, bool] = {}
        self._kept: set[str] = set()
        # The names the deny list was found not to name, for one superset test a span
        # before translation (deny_before_translation).
        self._not_denied: set[str] = set()
        self._prefilter = _prefilter(self.rules)
        # A custom pattern is tried on each string of a JSON text alone; the built-in ones
        # on a JSON text without escapes as written (see apply()).
        self._walk_documents = any(rule.per_text for rule in self.rules)

    @property
    def prefilter(self) -> Prefilter | None:
        """What every pattern's match needs, for the native decoder to look for; None: no test.

        A custom pattern's gates are the literals every match holds
        (:func:`required_literals`); one without any, and any pattern without the C
        extension, leaves nothing to look: then every span's texts go through the patterns.
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
        if self._deny is None or self._not_denied.issuperset(parts.attributes):
            return
        deny, not_denied = self._deny, self._not_denied
        if len(not_denied) > 100_000:  # names are few; this bounds a pathological producer
            not_denied.clear()
        dropped = []
        for key in parts.attributes:
            if deny.match(key) is None:
                not_denied.add(key)
            else:
                dropped.append(key)
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
        # Which rules a span needs is decided on a JSON text without escapes as written,
        # unparsed: it holds each of its strings as they are, and no built-in pattern
        # matches a quote, so a string's match is found there too (a key's or a number's
        # match at worst makes a rule run for nothing). Custom patterns see each string.
        documents: dict[int, Any] = {}
        walk = self._walk_documents
        for attributes in maps:
            for value in attributes.values():
                kind = type(value)
                if kind is str:
                    if value[:1] in ("[", "{") and (walk or "\\" in value):
                        document = _document(value)
                        if document is not None:
                            documents[id(value)] = document
                            texts.extend(_strings(document))
                            continue
                    texts.append(value)
                elif kind is list and value and type(value[0]) is str:
                    texts.extend(value)
        joined = _JOIN.join(texts)
        hits = [
            rule
            for rule in self.rules
            if (any(map(rule.may_match, texts)) if rule.per_text else rule.may_match(joined))
        ]
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
        if rule.gates_scanned:
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
    if len(gates) > MAX_GATES:
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
            if document is None and value[:1] in ("[", "{"):
                document = _document(value)  # left unparsed while rules were chosen
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
