"""An OTLP protobuf export request split by trace, its bytes kept.

The OTLP receiver forwards what it received: each span keeps its bytes, and so do the
resource and the scope around it; only the framing around them is written again, one
request per trace. The one change is to each resource: the producer's attribute
(``spanmill.producer``, who sent the request, by key id) is added, and any the
request set itself is left out, so that no sender can speak for another.

The request must have been checked before (the receiver decodes it first, to answer
400 for what the collector would refuse); :func:`split` raises ValueError for wire
bytes it cannot frame all the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_LEN = 2


@dataclass(frozen=True, slots=True)
class WireSpan:
    trace_id: str  # 32 lowercase hex characters
    scope: int  # which of the request's scopes holds it
    data: bytes  # the Span message


@dataclass(frozen=True, slots=True)
class WireRequest:
    """A request taken apart: every resource's and every scope's own fields, and the
    spans. ``resources[i]``: a ResourceSpans' fields but its scope spans, the resource
    rewritten; ``scopes[j]``: (its resource, a ScopeSpans' fields but its spans)."""

    resources: list[bytes] = field(default_factory=list)
    scopes: list[tuple[int, bytes]] = field(default_factory=list)
    spans: list[WireSpan] = field(default_factory=list)

    def traces(self) -> dict[str, list[WireSpan]]:
        """The spans of each trace, in the order the request gave them."""
        traces: dict[str, list[WireSpan]] = {}
        for span in self.spans:
            traces.setdefault(span.trace_id, []).append(span)
        return traces

    def encode(self, spans: Sequence[WireSpan]) -> bytes:
        """An export request of these spans, each in its own resource and scope."""
        grouped: dict[int, dict[int, list[bytes]]] = {}
        for span in spans:
            resource = self.scopes[span.scope][0]
            grouped.setdefault(resource, {}).setdefault(span.scope, []).append(span.data)
        out = bytearray()
        for resource, scopes in grouped.items():
            body = bytearray(self.resources[resource])
            for scope, datas in scopes.items():
                inner = bytearray(self.scopes[scope][1])
                for data in datas:
                    inner += _len_field(2, data)
                body += _len_field(2, bytes(inner))
            out += _len_field(1, bytes(body))
        return bytes(out)


def split(payload: bytes, producer_key: str, producer: str) -> WireRequest:
    """Take an ExportTraceServiceRequest apart; each resource gains the attribute
    ``producer_key`` = ``producer`` (the request's own values of it left out)."""
    request = WireRequest()
    stamp = _len_field(1, _key_value(producer_key, producer))
    for number, wire, _, value, end in _fields(payload):
        if number != 1 or wire != _LEN:
            raise ValueError(f"field {number} is not in an export request")
        own = bytearray()
        stamped = False
        index = len(request.resources)
        for n, w, s, v, e in _fields(payload, value, end):
            if n == 1 and w == _LEN:
                resource = _without_key(payload, v, e, producer_key) + stamp
                own += _len_field(1, resource)
                stamped = True
            elif n == 2 and w == _LEN:
                _scope_spans(payload, v, e, index, request)
            else:
                own += payload[s:e]
        if not stamped:
            own += _len_field(1, stamp)
        request.resources.append(bytes(own))
    return request


def _scope_spans(payload: bytes, start: int, end: int, resource: int, out: WireRequest) -> None:
    scope = len(out.scopes)
    own = bytearray()
    for n, w, s, v, e in _fields(payload, start, end):
        if n == 2 and w == _LEN:
            out.spans.append(WireSpan(_trace_id(payload, v, e), scope, payload[v:e]))
        else:
            own += payload[s:e]
    out.scopes.append((resource, bytes(own)))


def _trace_id(payload: bytes, start: int, end: int) -> str:
    for n, w, _, v, e in _fields(payload, start, end):
        if n == 1 and w == _LEN:
            if e - v != 16:
                raise ValueError("a span's trace id is not 16 bytes")
            return payload[v:e].hex()
    raise ValueError("a span has no trace id")


def _without_key(payload: bytes, start: int, end: int, key: str) -> bytes:
    """A Resource's fields, leaving out any attribute named ``key``."""
    wanted = key.encode()
    kept = bytearray()
    for n, w, s, v, e in _fields(payload, start, end):
        if n == 1 and w == _LEN and _key_of(payload, v, e) == wanted:
            continue
        kept += payload[s:e]
    return bytes(kept)


def _key_of(payload: bytes, start: int, end: int) -> bytes | None:
    for n, w, _, v, e in _fields(payload, start, end):
        if n == 1 and w == _LEN:
            return payload[v:e]
    return None


def _key_value(key: str, text: str) -> bytes:
    """A KeyValue of a string value."""
    return _len_field(1, key.encode()) + _len_field(2, _len_field(1, text.encode()))


def _len_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("a varint runs past its message")


def _fields(
    data: bytes, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """Each field of the message in ``data[start:end]``: its number, wire type, where
    it starts (its tag), where its value starts (a length-delimited value's first
    byte) and where it ends."""
    pos, end = start, len(data) if end is None else end
    while pos < end:
        tag, value = _read_varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = _read_varint(data, value, end)
        elif wire == 1:
            after = value + 8
        elif wire == _LEN:
            size, value = _read_varint(data, value, end)
            after = value + size
        elif wire == 5:
            after = value + 4
        else:
            raise ValueError(f"wire type {wire} is not taken")
        if number == 0 or after > end:
            raise ValueError("a field runs past its message")
        yield number, wire, pos, value, after
        pos = after
