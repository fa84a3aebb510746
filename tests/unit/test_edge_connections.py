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
