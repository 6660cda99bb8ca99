"""HTTPS_PROXY / HTTP_PROXY / NO_PROXY read as curl, requests and httpx read them."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.upstream.proxy import (
    NoProxy,
    ProxySettings,
    connect_request,
    is_loopback,
)

PROXY = "http://proxy.corp:3128"


def settings(**env: str) -> ProxySettings:
    return ProxySettings.from_environ(env)


def test_nothing_set_means_direct() -> None:
    assert settings().proxy_for("https", "api.openai.com", 443) is None
    assert settings(HTTPS_PROXY="", https_proxy="  ").https is None


def test_https_and_http_upstreams_use_their_own_variable() -> None:
    s = settings(HTTPS_PROXY=PROXY, HTTP_PROXY="http://other:8080")
    https = s.proxy_for("https", "api.openai.com", 443)
    plain = s.proxy_for("http", "internal.corp", 80)
    assert https is not None and (https.host, https.port, https.variable) == (
        "proxy.corp",
        3128,
        "HTTPS_PROXY",
    )
    assert plain is not None and plain.address == "other:8080"
    assert settings(HTTP_PROXY=PROXY).proxy_for("https", "api.openai.com", 443) is None


def test_the_lower_case_name_wins() -> None:
    s = settings(https_proxy="http://lower:1", HTTPS_PROXY="http://upper:2")
    assert s.https is not None and s.https.address == "lower:1"
    assert s.https.variable == "https_proxy"


def test_a_proxy_without_scheme_or_port_is_plain_http_on_port_80() -> None:
    p = settings(HTTPS_PROXY="proxy.corp").https
    assert p is not None and p.address == "proxy.corp:80"
    p6 = settings(HTTPS_PROXY="http://[fd00::1]:3128").https
    assert p6 is not None and p6.address == "[fd00::1]:3128"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("https://proxy.corp:443", "only http:// proxies"),
        ("socks5://proxy.corp:1080", "only http:// proxies"),
        ("http://proxy.corp:port", "port is not a number"),
        ("http://:3128", "names no host"),
    ],
)
def test_a_proxy_that_cannot_be_used_stops_start_up(value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        settings(HTTPS_PROXY=value)
    assert str(info.value).startswith("HTTPS_PROXY: ")


def test_credentials_become_a_basic_header_and_stay_out_of_messages() -> None:
    p = settings(HTTPS_PROXY="http://me%40corp:p%3Ass@proxy.corp:3128").https
    assert p is not None
    assert p.authorization == "Basic " + base64.b64encode(b"me@corp:p:ss").decode()
    for text in (repr(p), p.address, settings(HTTPS_PROXY=p.address).describe()):
        assert "p:ss" not in text and "p%3Ass" not in text and "Basic" not in text
    request = connect_request("api.openai.com", 443, p).decode()
    assert request.startswith("CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n")
    assert f"Proxy-Authorization: {p.authorization}\r\n" in request
    anonymous = settings(HTTPS_PROXY=PROXY).https
    assert anonymous is not None
    assert b"Proxy-Authorization" not in connect_request("h", 1, anonymous)


def test_an_ipv6_upstream_is_bracketed_in_connect() -> None:
    p = settings(HTTPS_PROXY=PROXY).https
    assert p is not None
    assert connect_request("2001:db8::1", 443, p).startswith(b"CONNECT [2001:db8::1]:443 ")


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("*", "api.openai.com", 443, True),
        ("openai.com", "openai.com", 443, True),
        ("openai.com", "api.openai.com", 443, True),  # a name covers its subdomains
        (".openai.com", "api.openai.com", 443, True),
        ("*.openai.com", "api.openai.com", 443, True),
        (".openai.com", "openai.com", 443, True),
        ("openai.com", "notopenai.com", 443, False),
        ("openai.com", "openai.com.evil.org", 443, False),
        ("OpenAI.COM", "API.openai.com", 443, True),  # case does not matter
        ("corp.internal:8443", "llm.corp.internal", 8443, True),
        ("corp.internal:8443", "llm.corp.internal", 443, False),  # that port only
        ("10.1.2.3", "10.1.2.3", 443, True),
        ("10.0.0.0/8", "10.200.3.4", 443, True),  # CIDR, as curl 7.86+ and requests
        ("10.0.0.0/8", "11.0.0.1", 443, False),
        ("fd00::/8", "[fd12::5]", 443, True),
        ("[fd12::5]", "fd12::5", 443, True),
        ("fd12::5", "[fd12::5]", 443, True),
        ("::/0", "10.0.0.1", 443, False),  # an IPv6 network holds no IPv4 address
        ("[fd12::5]:8443", "fd12::5", 8443, True),
        ("a.com, b.com  c.com", "x.c.com", 443, True),  # commas and spaces both separate
        ("", "api.openai.com", 443, False),
        ("a.com,,*.", "api.openai.com", 443, False),  # empty entries match nothing
    ],
)
def test_no_proxy(no_proxy: str, host: str, port: int, direct: bool) -> None:
    s = settings(HTTPS_PROXY=PROXY, NO_PROXY=no_proxy)
    assert (s.proxy_for("https", host, port) is None) is direct


def test_no_proxy_in_lower_case_wins() -> None:
    s = settings(HTTPS_PROXY=PROXY, no_proxy="a.com", NO_PROXY="b.com")
    assert s.proxy_for("https", "a.com", 443) is None
    assert s.proxy_for("https", "b.com", 443) is not None


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "api.localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]"]
)
def test_loopback_is_never_proxied(host: str) -> None:
    assert is_loopback(host)
    assert settings(HTTPS_PROXY=PROXY, HTTP_PROXY=PROXY).proxy_for("http", host, 8080) is None


@pytest.mark.parametrize("host", ["localhost.evil.org", "10.0.0.1", "vm", "::2"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)
    assert settings(HTTP_PROXY=PROXY).proxy_for("http", host, 80) is not None


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
# a host name, not an address: its last label is never all digits (0.0.0.0 is an address,
# and 0.0.0.0.0 no subdomain of it)
_name = (
    st.lists(_label, min_size=1, max_size=4)
    .map(".".join)
    .filter(lambda n: not n.rpartition(".")[2].isdigit())
)


@given(name=_name, sub=_label, others=st.lists(_name, max_size=3), port=st.integers(1, 65535))
def test_a_listed_name_and_its_subdomains_are_direct(
    name: str, sub: str, others: list[str], port: int
) -> None:
    no_proxy = NoProxy.parse(",".join([*others, name]))
    assert no_proxy.matches(name, port) and no_proxy.matches(f"{sub}.{name}", port)


@given(listed=_name, host=_name, port=st.integers(1, 65535))
def test_a_name_matches_itself_and_its_subdomains_only(listed: str, host: str, port: int) -> None:
    # "ample.com" covers www.ample.com, never example.com
    expected = host == listed or host.endswith("." + listed)
    assert NoProxy.parse(listed).matches(host, port) == expected
    assert NoProxy.parse(listed).matches("x" + listed, port) is False
