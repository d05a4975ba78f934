"""The generation paths answer methods other than POST with a 405 naming POST, after the key check."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.testclient import TestClient

from tokenrelay.config import Settings
from tokenrelay.errors import AuthenticationError
from tokenrelay.principal import ANONYMOUS, Principal
from tokenrelay.server.app import create_app


class OneKey:
    """A verifier that knows one bearer token."""

    async def authenticate(self, token: str | None) -> Principal:
        if token != "the-key":
            raise AuthenticationError("Incorrect API key provided.")
        return ANONYMOUS


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    app = create_app(Settings(data_dir=str(tmp_path), models=[]))
    app.state.services = SimpleNamespace(verifier=OneKey())  # no lifespan: nothing else is needed here
    return TestClient(app, headers={"Authorization": "Bearer the-key"})


def assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_a_generation_path_takes_post_only(client: TestClient, path: str, method: str) -> None:
    response = client.request(method, path, headers={"X-Request-ID": "wrong-method"})
    assert_openai_error(response, 405)
    assert response.headers["allow"] == "POST"
    assert response.headers["x-request-id"] == "wrong-method"
    assert "POST" in response.json()["error"]["message"]


def test_the_key_is_checked_before_the_method(client: TestClient) -> None:
    response = client.get("/v1/chat/completions", headers={"Authorization": "Bearer wrong"})
    assert_openai_error(response, 401)
    assert "allow" not in response.headers


def test_fastapis_own_405s_name_the_allowed_methods_too(client: TestClient) -> None:
    response = client.post("/v1/models")
    assert_openai_error(response, 405)
    assert "GET" in response.headers["allow"].split(", ")


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_paths_answer_a_wrong_method_in_anthropics_shape(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["type"] == "error" and set(response.json()["error"]) == {"type", "message"}


def test_anthropic_paths_refuse_a_wrong_key_in_anthropics_shape(client: TestClient) -> None:
    response = client.post("/v1/messages", json={}, headers={"Authorization": "", "x-api-key": "wrong"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
