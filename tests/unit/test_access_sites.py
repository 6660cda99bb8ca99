"""Which Host and Origin a gateway answers, which bodies it reads, and where it may listen
without keys: golden cases per listening address."""

from __future__ import annotations

import pytest

from boundedcode_gateway.access.listen import listen_refusal
from boundedcode_gateway.access.sites import (
    SitePolicy,
    UnsupportedMediaType,
    check_json_body,
    is_loopback,
)
from boundedcode_gateway.config import AuthSettings
from boundedcode_gateway.errors import Forbidden

ALLOWED = ("gw.corp.internal", "host.docker.internal", "10.1.2.3", "[fd00::5]")

# (listening on, Host header, answered)
HOSTS = [
    ("127.0.0.1", "127.0.0.1:8780", True),
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "localhost:8780", True),
    ("127.0.0.1", "LOCALHOST.:8780", True),
    ("127.0.0.1", "[::1]:8780", True),
    ("127.0.0.1", "127.0.0.2:9999", True),  # any loopback address, any port (a tunnel's)
    ("127.0.0.1", "gw.corp.internal:443", True),
    ("127.0.0.1", "host.docker.internal", True),
    ("127.0.0.1", "10.1.2.3:8780", True),
    ("127.0.0.1", "[fd00:0::5]:8780", True),  # an allowed address however it is written
    ("127.0.0.1", "evil.example:8780", False),  # a rebound name
    ("127.0.0.1", "localhost.evil.example", False),
    ("127.0.0.1", "127.0.0.1.nip.io:8780", False),
    ("127.0.0.1", "192.168.1.5:8780", False),
    ("127.0.0.1", "", False),
    ("127.0.0.1", "[::1", False),
    ("192.168.1.5", "192.168.1.5:8780", True),
    ("192.168.1.5", "192.168.1.6:8780", False),
    ("gw.lan", "GW.lan:8780", True),
    ("gw.lan", "other.lan:8780", False),
    ("0.0.0.0", "192.168.1.5:8780", True),  # a wildcard listener: any of its addresses
    ("0.0.0.0", "[fe80::1]:8780", True),
    ("0.0.0.0", "evil.example:8780", False),  # but not a name
    ("::", "172.17.0.1:8780", True),
    ("[::]", "gw.corp.internal", True),
]


@pytest.mark.parametrize(("listen", "host", "answered"), HOSTS)
def test_host(listen: str, host: str, answered: bool) -> None:
    policy = SitePolicy(listen, ALLOWED)
    if answered:
        policy.check(host, None)
        return
    with pytest.raises(Forbidden) as info:
        policy.check(host, None)
    assert (info.value.http_status, info.value.code) == (403, "host_not_allowed")
    assert "limits.allowed_hosts" in info.value.message


def test_no_host_header_is_answered() -> None:
    SitePolicy("127.0.0.1").check(None, None)


# (listening on, Origin header, answered)
ORIGINS = [
    ("127.0.0.1", "http://127.0.0.1:8780", True),
    ("127.0.0.1", "http://localhost:3000", True),
    ("127.0.0.1", "https://gw.corp.internal", True),
    ("127.0.0.1", "https://evil.example", False),
    ("127.0.0.1", "http://evil.example:8780", False),
    ("127.0.0.1", "null", False),  # sandboxed frames, file: pages
    ("127.0.0.1", "", False),
    ("127.0.0.1", "http://[::1", False),
    ("192.168.1.5", "http://192.168.1.5:8780", True),
    # a wildcard listener answers any address as Host, but a page at another address
    # is another site
    ("0.0.0.0", "http://192.168.1.99:8000", False),
    ("0.0.0.0", "http://10.1.2.3", True),
]


@pytest.mark.parametrize(("listen", "origin", "answered"), ORIGINS)
def test_origin(listen: str, origin: str, answered: bool) -> None:
    policy = SitePolicy(listen, ALLOWED)
    if answered:
        policy.check("127.0.0.1:8780", origin)
        return
    with pytest.raises(Forbidden) as info:
        policy.check("127.0.0.1:8780", origin)
    assert (info.value.http_status, info.value.code) == (403, "origin_not_allowed")


def test_a_long_host_is_shown_cut_short() -> None:
    with pytest.raises(Forbidden) as info:
        SitePolicy("127.0.0.1").check("a" * 5000, None)
    assert len(info.value.message) < 300


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"],
)
def test_json_bodies_are_read(content_type: str) -> None:
    check_json_body(content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        None,  # a fetch() of a Blob without a type
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/json-patch+json",
        "",
    ],
)
def test_other_bodies_are_415(content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        check_json_body(content_type)
    assert (info.value.http_status, info.value.code) == (415, "unsupported_media_type")
    assert "application/json" in info.value.message


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.5", False),
        ("localhost.example", False),
        ("myhost", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


KEYS = AuthSettings(token_secret_env="SECRET")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.53"])
def test_loopback_needs_no_keys(host: str) -> None:
    assert listen_refusal(host, None, insecure_no_auth=False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gw.lan", ""])
def test_elsewhere_needs_keys_or_the_insecure_flag(host: str) -> None:
    refusal = listen_refusal(host, None, insecure_no_auth=False)
    assert refusal is not None
    assert "boundedcode-gateway key new" in refusal and "--insecure-no-auth" in refusal
    assert listen_refusal(host, KEYS, insecure_no_auth=False) is None
    assert listen_refusal(host, None, insecure_no_auth=True) is None
