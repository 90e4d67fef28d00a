"""The protobuf wire format by hand: varints, and saying where a payload is broken.

The protobuf runtime reports any failure as one generic "Error parsing message".
A producer needs more: which field holds invalid UTF-8, or where the bytes end
early. :func:`diagnose` walks the wire format against the message descriptor and
finds the first fault. It runs only on the error path, so it is plain Python.
:func:`read_varint` and :func:`varint` also serve the receiver's forwarding
(:mod:`spanmill.collector.forward`) and its replies.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from spanmill.spans.errors import BAD_PROTOBUF, INVALID_UTF8

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_FIXED64: Final = {
    FieldDescriptor.TYPE_DOUBLE,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
_FIXED32: Final = {
    FieldDescriptor.TYPE_FLOAT,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_SFIXED32,
}
_DELIMITED: Final = {
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BYTES,
    FieldDescriptor.TYPE_MESSAGE,
}
_WIRE_NAMES: Final = {
    0: "varint",
    1: "64-bit",
    2: "length-delimited",
    3: "group start",
    4: "group end",
    5: "32-bit",
}


class _Fault(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _expected_wire(field: FieldDescriptor) -> int:
    if field.type in _DELIMITED:
        return _LEN
    if field.type in _FIXED64:
        return _I64
    if field.type in _FIXED32:
        return _I32
    return _VARINT


class VarintError(ValueError):
    """A varint that runs past its message or over 64 bits; ``at``: where reading stopped."""

    def __init__(self, at: int) -> None:
        super().__init__(f"a varint runs past its message or over 64 bits at byte {at}")
        self.at = at


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``data[pos:end]`` and where it ends; VarintError where it cannot."""
    result = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise VarintError(pos)


def varint(value: int) -> bytes:
    """``value`` (not negative) as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint(data: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    try:
        return read_varint(data, pos, end)
    except VarintError as exc:
        raise _Fault(
            BAD_PROTOBUF, f"{where}: truncated or overlong varint ending at byte {exc.at}"
        ) from None


def _walk(data: bytes, pos: int, end: int, descriptor: Descriptor, path: str) -> None:
    counts: dict[int, int] = {}
    while pos < end:
        tag_at = pos
        tag, pos = _varint(data, pos, end, path or "message")
        number, wire = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number)
        where = path or "message"
        if field is not None:
            where = f"{path}.{field.name}" if path else field.name
            if field.is_repeated:
                index = counts.get(number, 0)
                counts[number] = index + 1
                where += f"[{index}]"
            expected = _expected_wire(field)
            packed = wire == _LEN and field.is_repeated and expected != _LEN
            if wire != expected and not packed:
                raise _Fault(
                    BAD_PROTOBUF,
                    f"{where}: has wire type {_WIRE_NAMES.get(wire, wire)} at byte {tag_at}, "
                    f"expected {_WIRE_NAMES[expected]}; is this an OTLP trace export?",
                )
        if number == 0:
            raise _Fault(BAD_PROTOBUF, f"{where}: field number 0 at byte {tag_at} is invalid")
        if wire == _VARINT:
            _, pos = _varint(data, pos, end, where)
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
        elif wire == _LEN:
            length, pos = _varint(data, pos, end, where)
            if pos + length > end:
                raise _Fault(
                    BAD_PROTOBUF,
                    f"{where}: declares {length} bytes at byte {pos} but only "
                    f"{end - pos} remain; the payload is truncated or not protobuf",
                )
            if field is not None and field.message_type is not None:
                _walk(data, pos, pos + length, field.message_type, where)
            elif field is not None and field.type == FieldDescriptor.TYPE_STRING:
                _check_utf8(data[pos : pos + length], pos, where)
            pos += length
        else:
            raise _Fault(
                BAD_PROTOBUF,
                f"{where}: unsupported wire type {_WIRE_NAMES.get(wire, wire)} at byte "
                f"{tag_at}; the payload is probably not protobuf",
            )
        if pos > end:
            raise _Fault(BAD_PROTOBUF, f"{where}: fixed-size value runs past the end at byte {end}")


def _check_utf8(raw: bytes, offset: int, where: str) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Fault(
            INVALID_UTF8,
            f"{where}: string is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at payload "
            f"offset {offset + exc.start}); protobuf string fields must be UTF-8",
        ) from None


def diagnose(payload: bytes, descriptor: Descriptor) -> tuple[str, str]:
    """The reason code and detail for a payload the protobuf parser refused."""
    try:
        _walk(payload, 0, len(payload), descriptor, "")
    except _Fault as fault:
        return fault.reason, fault.detail
    except RecursionError:
        return BAD_PROTOBUF, "messages are nested too deeply"
    return BAD_PROTOBUF, f"not a valid {descriptor.full_name} message"
