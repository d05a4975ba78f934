"""Upstream settings as a config file gives them: routing defaults and overrides, names, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenrelay.config import ModelSettings, UpstreamSettings, load_settings

CONFIG = """
routing:
  timeouts: {connect: 2, first_byte: 30}
  health: {probe_interval: 5}
models:
  - id: big-model
    upstreams:
      - url: http://10.0.0.5:8000/v1
        model: meta-llama/Llama-3.1-8B-Instruct
        api_key: ${NODE_KEY}
        weight: 2
        max_in_flight: 64
  - id: cached
    routing: {affinity: {enabled: true, prefix_chars: 512}, max_attempts: 2}
    upstreams:
      - {url: "http://10.0.0.6:8000/v1", name: gpu-6, completions_via_chat: true}
"""


def test_the_issue_example_loads_with_routing_defaults_and_per_model_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_KEY", "sk-node-secret")
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    settings = load_settings(path)
    big, cached = settings.models
    node = big.upstreams[0]
    assert node.api_key is not None and node.api_key.get_secret_value() == "sk-node-secret"
    assert "sk-node-secret" not in repr(settings)
    assert (node.model, node.weight, node.max_in_flight, node.label) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        2,
        64,
        "10.0.0.5:8000",
    )
    routing = settings.routing_for(big)
    assert (routing.timeouts.connect, routing.timeouts.first_byte, routing.timeouts.idle) == (2, 30, 60)
    assert routing.health.probe_interval == 5 and not routing.affinity.enabled
    own = settings.routing_for(cached)
    assert own.affinity.enabled and own.affinity.prefix_chars == 512 and own.max_attempts == 2
    assert cached.upstreams[0].label == "gpu-6" and cached.upstreams[0].completions_via_chat


def test_two_upstreams_of_a_model_need_distinct_names() -> None:
    same = {"url": "http://127.0.0.1:8001/v1"}
    with pytest.raises(ValueError, match="distinct `name`s"):
        ModelSettings(id="x", upstreams=[same, same | {"model": "other"}])
    named = ModelSettings(id="x", upstreams=[same | {"name": "one"}, same | {"name": "two"}])
    assert [u.label for u in named.upstreams] == ["one", "two"]
    assert UpstreamSettings(url="http://user:pw@10.0.0.5:8000/v1").label == "10.0.0.5:8000"


@pytest.mark.parametrize("url", ["10.0.0.5:8000/v1", "ftp://node/v1", "http://"])
def test_an_upstream_url_must_be_http(url: str) -> None:
    with pytest.raises(ValueError):
        UpstreamSettings(url=url)


def test_native_apis_name_only_the_apis_that_can_be_relayed() -> None:
    node = UpstreamSettings(url="http://10.0.0.7:8000/v1", native_apis=["responses", "messages"])
    assert node.native_apis == ["responses", "messages"]
    assert UpstreamSettings(url="http://10.0.0.7:8000/v1").native_apis == []
    with pytest.raises(ValueError, match="native_apis"):
        UpstreamSettings(url="http://10.0.0.7:8000/v1", native_apis=["chat"])  # type: ignore[list-item]


@pytest.mark.parametrize("host", ["[::1]", "[2001:db8::8:800:200c:417a]", "[::ffff:10.0.0.1]", "[fe80::1]"])
def test_a_node_url_may_name_any_ipv6_address(host: str) -> None:
    assert UpstreamSettings(url=f"http://{host}:8000/v1").label == f"{host}:8000"


@pytest.mark.parametrize("host", ["[::1::]", "[12345::1]", "[1:2:3:4:5:6:7:8:9]", "[::ffff:10.0.0.256]", "[:]"])
def test_a_node_url_with_an_address_that_is_not_ipv6_is_refused(host: str) -> None:
    with pytest.raises(ValidationError, match="IPv6 address is not valid"):
        UpstreamSettings(url=f"http://{host}:8000/v1")
