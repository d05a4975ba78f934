"""A node's URL taken apart: the forms shown and derived, and what is wrong with one that cannot be a node's."""

from __future__ import annotations

import pytest

from tokenrelay.nodeurl import NodeUrl


def test_credentials_are_kept_out_of_the_shown_url_and_in_the_server_root() -> None:
    url = NodeUrl.parse("http://user:pw@Node.Example:8000/v1/?q=1#top")
    assert (url.authority, url.host, url.port, url.base_path) == ("Node.Example:8000", "node.example", 8000, "/v1")
    assert url.shown == "http://Node.Example:8000/v1/"
    assert url.server_root == "http://user:pw@Node.Example:8000"
    assert url.host_header == "node.example:8000"


def test_the_server_root_drops_only_a_trailing_v1() -> None:
    assert NodeUrl.parse("https://api.example/v1").server_root == "https://api.example"
    assert NodeUrl.parse("https://api.example/proxy/v1/").server_root == "https://api.example/proxy"
    assert NodeUrl.parse("https://api.example/openai").server_root == "https://api.example/openai"


def test_a_default_port_is_left_out_of_the_host_header() -> None:
    assert NodeUrl.parse("https://[::1]/v1").host_header == "[::1]"
    assert NodeUrl.parse("https://[::1]:8443/v1").host_header == "[::1]:8443"
    assert NodeUrl.parse("http://node:80").port == 80 and NodeUrl.parse("http://node").port == 80


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://node/v1", "not an http(s) URL: ftp://node"),
        ("http://[::1::]:8000/v1", "the URL's IPv6 address is not valid"),
        ("http://[v1.x]/v1", "the URL's IPv6 address is not valid"),
        ("http://user@:8000/v1", "the URL has no host"),
    ],
)
def test_what_is_wrong_with_a_url_is_said(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        NodeUrl.parse(url)
    assert str(caught.value) == problem
