"""The generation paths answer methods other than POST as FastAPI would: a 405 naming POST, after the key check."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.testclient import TestClient

from tokenrelay.auth.principal import ANONYMOUS, Principal
from tokenrelay.config import Settings
from tokenrelay.errors import AuthenticationError
from tokenrelay.server.app import create_app


class OneKey:
    """A verifier that knows one bearer token."""

    async def authenticate(self, token: str | None) -> Principal:
        if token != "the-key":
            raise AuthenticationError("Incorrect API key provided.")
        return ANONYMOUS


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    lane = create_app(Settings(data_dir=str(tmp_path), models=[]))
    lane.app.state.services = SimpleNamespace(verifier=OneKey())  # no lifespan: nothing else is needed here
    return TestClient(lane, headers={"Authorization": "Bearer the-key"})


def assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_a_generation_path_takes_post_only(client: TestClient, path: str, method: str) -> None:
    response = client.request(method, path, headers={"X-Request-ID": "lane-405"})
    assert_openai_error(response, 405)
    assert response.headers["allow"] == "POST"
    assert response.headers["x-request-id"] == "lane-405"
    assert "POST" in response.json()["error"]["message"]


def test_the_key_is_checked_before_the_method(client: TestClient) -> None:
    response = client.get("/v1/chat/completions", headers={"Authorization": "Bearer wrong"})
    assert_openai_error(response, 401)
    assert "allow" not in response.headers


def test_fastapis_own_405s_name_the_allowed_methods_too(client: TestClient) -> None:
    response = client.post("/v1/models")
    assert_openai_error(response, 405)
    assert "GET" in response.headers["allow"].split(", ")
