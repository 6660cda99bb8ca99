"""Which upstreams are reached through an HTTP proxy: HTTPS_PROXY, HTTP_PROXY, NO_PROXY (pure).

Read from the environment once, when the HTTP client is made, as curl, requests and
httpx read them: the lower-case name wins over the upper-case one; ``https://``
upstreams use HTTPS_PROXY, ``http://`` upstreams HTTP_PROXY. NO_PROXY lists hosts to
reach directly: ``*`` (every host), a name (itself and every subdomain, with or
without a leading ``.`` or ``*.``), ``name:port`` (that port only), an IP address
or a CIDR network (``10.0.0.0/8``, ``fd00::/8``). One difference: a loopback
upstream (``localhost``, ``127.0.0.0/8``, ``::1``) is never proxied, as in Go's
net/http, so the gateway's own llama-server is reached whatever the proxy settings.

Only ``http://`` proxies are supported (the gateway speaks plain HTTP to the proxy and
tunnels TLS through it with CONNECT); credentials in the proxy URL are sent as
``Proxy-Authorization: Basic`` and never appear in a message or log.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from boundedcode_gateway.errors import ConfigError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where it listens, which variable named it, and its credentials."""

    host: str
    port: int
    variable: str
    # the Proxy-Authorization value; kept out of repr so no log line can show it
    authorization: str | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` for messages (no credentials)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class NoProxy:
    """The parsed NO_PROXY list."""

    everything: bool = False
    # (name without leading dot, port or None for any port)
    names: tuple[tuple[str, int | None], ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, value: str) -> NoProxy:
        names: list[tuple[str, int | None]] = []
        networks: list[IPNetwork] = []
        for raw in value.replace(",", " ").split():
            entry = raw.lower()
            if entry == "*":
                return cls(everything=True)
            network = _network(entry)
            if network is not None:
                networks.append(network)
                continue
            host, port = _host_and_port(entry)
            host = host.removeprefix("*").lstrip(".")
            if host:
                names.append((host, port))
        return cls(False, tuple(names), tuple(networks))

    def matches(self, host: str, port: int) -> bool:
        if self.everything:
            return True
        host = host.lower().strip("[]").rstrip(".")
        ip = _ip(host)
        if ip is not None and any(ip.version == net.version and ip in net for net in self.networks):
            return True
        return any(
            (wanted is None or wanted == port) and (host == name or host.endswith("." + name))
            for name, wanted in self.names
        )


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """The proxies for ``http://`` and ``https://`` upstreams, and the hosts that skip them."""

    http: Proxy | None = None
    https: Proxy | None = None
    no_proxy: NoProxy = NoProxy()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ProxySettings:
        """The settings the environment holds; a proxy URL that cannot be used stops start-up."""
        no_proxy = _variable(environ, "no_proxy")
        return cls(
            http=_proxy(environ, "http_proxy"),
            https=_proxy(environ, "https_proxy"),
            no_proxy=NoProxy.parse(no_proxy[1]) if no_proxy else NoProxy(),
        )

    def proxy_for(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy an upstream origin is reached through, or None for a direct connection."""
        proxy = self.https if scheme == "https" else self.http
        if proxy is None or is_loopback(host) or self.no_proxy.matches(host, port):
            return None
        return proxy

    def describe(self) -> str:
        """One line for the start-up log: proxies by address only."""
        parts = [
            f"{scheme} upstreams through {proxy.address} ({proxy.variable})"
            for scheme, proxy in (("https", self.https), ("http", self.http))
            if proxy is not None
        ]
        return "; ".join(parts)


def is_loopback(host: str) -> bool:
    host = host.lower().strip("[]").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def connect_request(host: str, port: int, proxy: Proxy) -> bytes:
    """The CONNECT request that asks ``proxy`` for a tunnel to ``host:port``."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _variable(environ: Mapping[str, str], lower: str) -> tuple[str, str] | None:
    """(name, value) of the lower-case variable, else the upper-case one; empty is unset."""
    for name in (lower, lower.upper()):
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _proxy(environ: Mapping[str, str], lower: str) -> Proxy | None:
    found = _variable(environ, lower)
    if found is None:
        return None
    name, value = found
    if "://" not in value:
        value = "http://" + value  # "proxy:3128", as curl and requests take it
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme != "http":
        raise ConfigError(
            f"{name}: only http:// proxies are supported (the value starts with {scheme}://)"
        )
    try:
        port = parts.port or 80
    except ValueError:
        raise ConfigError(f"{name}: the proxy's port is not a number") from None
    if not parts.hostname:
        raise ConfigError(f"{name}: the proxy URL names no host")
    authorization = None
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")
    return Proxy(parts.hostname, port, name, authorization)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _network(entry: str) -> IPNetwork | None:
    """An IP address or CIDR network entry (IPv6 with or without brackets), else None."""
    text = entry.strip("[]") if entry.startswith("[") and entry.endswith("]") else entry
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _host_and_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:8080
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
        return host, int(port) if port.isdigit() else None
    host, sep, port = entry.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host, int(port)
    return entry, None
