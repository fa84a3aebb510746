"""Which peer a connection counts against (edge.connections' cap per peer)."""

from __future__ import annotations

import pytest

from ortserve.edge.connections import peer_of


@pytest.mark.parametrize(
    ("host", "peer"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("192.168.1.20", "192.168.1.20"),
        ("::ffff:192.168.1.20", "192.168.1.20"),  # a dual-stack listener's IPv4 client
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # same /64: same peer
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::1", "::/64"),
        (None, ""),  # the address could not be read
    ],
)
def test_a_peer_is_an_ipv4_address_or_an_ipv6_64(host: str | None, peer: str) -> None:
    assert peer_of(host) == peer


def test_each_connection_of_the_daemons_listener_sends_writes_at_once() -> None:
    """TCP_NODELAY on an accepted connection of the daemon's own listener: asyncio sets
    it only where the socket's proto is IPPROTO_TCP, and `socket.create_server` (the
    daemon's `_listen`) makes proto 0 sockets; without it a response's body waited for the
    ACK of its head, which the client delays (~40 ms a kept-alive request here)."""
    import asyncio
    import socket

    from ortserve.edge.connections import no_delay
    from ortserve.edge.daemon import _listen

    listener = _listen("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()

    async def option_after() -> int:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, accepted)
        try:
            no_delay(transport)
            sock = transport.get_extra_info("socket")
            return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        finally:
            transport.close()

    try:
        assert asyncio.run(option_after()) == 1
    finally:
        client.close()
        listener.close()
