"""An upstream node's URL, taken apart once: where to connect, what each request's head carries, and the forms of
it that are shown (without credentials) or derived (the server's root)."""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_BAD_IPV6 = "the URL's IPv6 address is not valid"


@dataclass(frozen=True, slots=True)
class NodeUrl:
    """An http(s) URL with a host, e.g. "http://user:pw@node:8000/v1"."""

    scheme: str  # "http" or "https"
    host: str  # lower-cased; an IPv6 address without its brackets
    port: int  # as written, else the scheme's default
    path: str  # as written, e.g. "/v1/"
    authority: str  # host and port as written, without credentials, e.g. "node:8000"
    credentials: str  # "user:pw@" as written, or ""
    basic_auth: str | None  # the credentials as an Authorization value

    @classmethod
    def parse(cls, url: str) -> NodeUrl:
        """The parts of `url`; a `ValueError` saying what is wrong when it is not an http(s) URL with a host."""
        try:
            parts = urlsplit(url)  # checks a bracketed host with `ipaddress`
        except ValueError:
            raise ValueError(_BAD_IPV6) from None
        host = parts.hostname or ""
        if parts.scheme not in _DEFAULT_PORTS:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{host}")
        authority = parts.netloc.rpartition("@")[2]
        # `urlsplit` also lets through an IPvFuture literal ("[v1.x]"), which no node can be reached at.
        if authority.startswith("[") and not _is_ipv6(host):
            raise ValueError(_BAD_IPV6)
        if not host:
            raise ValueError("the URL has no host")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        credentials = parts.netloc.removesuffix(authority)
        return cls(parts.scheme, host, port, parts.path, authority, credentials, _basic_auth(parts))

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def base_path(self) -> str:
        """The path without its trailing slash, e.g. "/v1": what a request's path is appended to."""
        return self.path.rstrip("/")

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def shown(self) -> str:
        """The URL without credentials, query or fragment (for status pages and logs)."""
        return f"{self.scheme}://{self.authority}{self.path}"

    @property
    def server_root(self) -> str:
        """The node's server root, credentials kept: the URL without the trailing `/v1` of the OpenAI API."""
        return f"{self.scheme}://{self.credentials}{self.authority}{self.base_path.removesuffix('/v1')}"


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _basic_auth(parts: SplitResult) -> str | None:
    if parts.username is None:
        return None
    secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return "Basic " + base64.b64encode(secret).decode()
