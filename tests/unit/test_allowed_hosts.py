"""The Host check (server/hosts.py): what a Host value names, the default set, the configured set."""

from __future__ import annotations

import ipaddress

import pytest

from radixjobs.server.hosts import AllowedHosts, host_of


@pytest.mark.parametrize(("header", "named"), [
    ("localhost", "localhost"), ("LocalHost.:7317", "localhost"), ("127.0.0.1", ipaddress.ip_address("127.0.0.1")),
    ("127.0.0.1:7317", ipaddress.ip_address("127.0.0.1")), ("[::1]", ipaddress.ip_address("::1")),
    ("[::1]:7317", ipaddress.ip_address("::1")), ("[0:0::1]:1", ipaddress.ip_address("::1")),
    ("[::ffff:127.0.0.1]:1", ipaddress.ip_address("127.0.0.1")), ("sched.example.com:80", "sched.example.com"),
    ("::1", None), ("[::1", None), ("[::1]x", None), ("[::1]:", None), ("[127.0.0.1]", None), ("host:", None),
    ("host:port", None), ("host:123456", None), ("", None), ("a b", None), ("-a.example", None), ("*", None),
    ("a..example", None), ("é.example", None), ("x" * 64 + ".example", None),
])
def test_host_of(header: str, named: object) -> None:
    assert host_of(header) == named


def test_the_default_is_the_bound_host_its_addresses_and_localhost() -> None:
    loopback = AllowedHosts.default("127.0.0.1", ["127.0.0.1"])
    assert [loopback.allows(h) for h in ("127.0.0.1:1", "localhost", "[::1]", "127.0.0.2", "evil.example",
                                         None)] == [True, True, False, False, False, False]
    named = AllowedHosts.default("sched.internal", ["127.0.0.3"])
    assert [named.allows(h) for h in ("sched.internal:7317", "127.0.0.3:7317", "localhost", "other.internal")] == \
        [True, True, True, False]
    v6 = AllowedHosts.default("::1", ["::1"])
    assert [v6.allows(h) for h in ("[::1]:7317", "127.0.0.1", "localhost:1")] == [True, False, True]


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_bind_accepts_literal_addresses_and_localhost_only(wildcard: str) -> None:
    allowed = AllowedHosts.default(wildcard, [wildcard])
    assert allowed.any_address
    assert all(allowed.allows(h) for h in ("127.0.0.7:7317", "[::1]:7317", "localhost"))
    assert not any(allowed.allows(h) for h in ("rebind.example", "rebind.example:7317", "127.0.0.7.nip.io"))


def test_configured_hosts_replace_the_default() -> None:
    allowed = AllowedHosts.of(["Sched.Example.com., 127.0.0.7", "[::1]"])
    assert allowed.names == {"sched.example.com"}
    assert [allowed.allows(h) for h in ("sched.example.com:443", "127.0.0.7", "[0:0::1]:1", "localhost",
                                        "127.0.0.1")] == [True, True, True, False, False]
    assert allowed.describe() == "sched.example.com,127.0.0.7,::1"


@pytest.mark.parametrize("entry", ["evil.example:80", "*.example.com", "*", "http://x", "a b", "[::1]:80"])
def test_a_bad_configured_entry_is_named(entry: str) -> None:
    with pytest.raises(ValueError, match="is not a host name or an IP address"):
        AllowedHosts.of([entry])
    with pytest.raises(ValueError, match="at least one"):
        AllowedHosts.of([" , "])
