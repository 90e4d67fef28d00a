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

from spanmill.spans.protowire import read_varint, varint

_LEN = 2


@dataclass(frozen=True, slots=True)
class WireSpan:
    trace_id: str  # 32 lowercase hex characters
    span_id: str  # 16 lowercase hex characters
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
                    inner += len_field(2, data)
                body += len_field(2, bytes(inner))
            out += len_field(1, bytes(body))
        return bytes(out)


def split(payload: bytes, producer_key: str, producer: str) -> WireRequest:
    """Take an ExportTraceServiceRequest apart; each resource gains the attribute
    ``producer_key`` = ``producer`` (the request's own values of it left out)."""
    request = WireRequest()
    stamp = len_field(1, _key_value(producer_key, producer))
    for number, wire, _, value, end in _fields(payload):
        if number != 1 or wire != _LEN:
            raise ValueError(f"field {number} is not in an export request")
        own = bytearray()
        stamped = False
        index = len(request.resources)
        for n, w, s, v, e in _fields(payload, value, end):
            if n == 1 and w == _LEN:
                resource = _without_key(payload, v, e, producer_key) + stamp
                own += len_field(1, resource)
                stamped = True
            elif n == 2 and w == _LEN:
                _scope_spans(payload, v, e, index, request)
            else:
                own += payload[s:e]
        if not stamped:
            own += len_field(1, stamp)
        request.resources.append(bytes(own))
    return request


def _scope_spans(payload: bytes, start: int, end: int, resource: int, out: WireRequest) -> None:
    scope = len(out.scopes)
    own = bytearray()
    for n, w, s, v, e in _fields(payload, start, end):
        if n == 2 and w == _LEN:
            out.spans.append(WireSpan(*_ids(payload, v, e), scope, payload[v:e]))
        else:
            own += payload[s:e]
    out.scopes.append((resource, bytes(own)))


def _ids(payload: bytes, start: int, end: int) -> tuple[str, str]:
    """A span's trace and span ids, in hex."""
    ids: dict[int, str] = {}
    for n, w, _, v, e in _fields(payload, start, end):
        if n in (1, 2) and w == _LEN:
            ids[n] = payload[v:e].hex()
    if len(ids.get(1, "")) != 32:
        raise ValueError("a span has no trace id of 16 bytes")
    return ids[1], ids.get(2, "")


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
    return len_field(1, key.encode()) + len_field(2, len_field(1, text.encode()))


def len_field(number: int, data: bytes) -> bytes:
    """A length-delimited field: its tag, its length and ``data``."""
    return varint(number << 3 | _LEN) + varint(len(data)) + data


def _fields(
    data: bytes, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """Each field of the message in ``data[start:end]``: its number, wire type, where
    it starts (its tag), where its value starts (a length-delimited value's first
    byte) and where it ends."""
    pos, end = start, len(data) if end is None else end
    while pos < end:
        tag, value = read_varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = read_varint(data, value, end)
        elif wire == 1:
            after = value + 8
        elif wire == _LEN:
            size, value = read_varint(data, value, end)
            after = value + size
        elif wire == 5:
            after = value + 4
        else:
            raise ValueError(f"wire type {wire} is not taken")
        if number == 0 or after > end:
            raise ValueError("a field runs past its message")
        yield number, wire, pos, value, after
        pos = after
