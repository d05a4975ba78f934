"""Two server processes sharing one database (replicas), and rounds of concurrent completions spread over them,
for the tests that race one key's limits across replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import openai
from servers import DEFAULT_MODEL, Server


@dataclass
class Replicas:
    a: Server
    b: Server
    url: str
    admin: str

    def create(self, server: Server, **spec: object) -> str:
        """A key made through `server`'s admin API: its secret."""
        with server.http(headers={"Authorization": f"Bearer {self.admin}"}) as http:
            response = http.post("/admin/keys", json=spec)
        assert response.status_code == 201, response.text
        return response.json()["key"]


Measure = Callable[[openai.types.Completion], int]


async def completion_round(servers: list[Server], key: str, size: int, measure: Measure) -> list[int | str]:
    """`size` requests at once, taking turns over `servers`: each answer's `measure`, or a refusal's error code."""
    clients = [
        openai.AsyncOpenAI(base_url=f"{s.base_url}/v1", api_key=key, max_retries=0, timeout=300) for s in servers
    ]

    async def one(i: int) -> int | str:
        try:
            reply = await clients[i % len(clients)].completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=4)
        except openai.RateLimitError as exc:
            return str(exc.code)
        return measure(reply)

    try:
        return list(await asyncio.gather(*(one(i) for i in range(size))))
    finally:
        for client in clients:
            await client.close()
