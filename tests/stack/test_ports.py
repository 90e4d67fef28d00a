"""Ports for services the tests start: never ones the kernel hands to outgoing connections."""

from __future__ import annotations

import socket

from spanmill.stack.ports import _ephemeral_low, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports)
    # Each could be bound when handed out; the last one still can.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_taken_port_is_not_handed_out() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert busy not in {free_port() for _ in range(200)}
