"""Residency decisions with engines faked at the seam where a `ResidentModel` makes one: which idle model makes
room, waiting for a busy one, one load shared by concurrent requests, pins, keep-alive and the load bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tokenrelay.backends.base import Events, ModelCard, Ticket, Usage
from tokenrelay.backends.residency import Residency
from tokenrelay.backends.resident import Keeping, ResidentModel
from tokenrelay.config import EngineSettings
from tokenrelay.errors import APIError, Overloaded
from tokenrelay.protocol.chat import ChatCompletionRequest


class FakeEngine:
    """Stands where `LlamaCppBackend` does: a start that takes `load_seconds`, a chat that waits for `release`."""

    def __init__(self, model_id: str, path: Path, log: list[str], load_seconds: float, fail: bool) -> None:
        self.card = ModelCard(model_id, "tokenrelay", 0, context_length=512, slot_contexts=(512,))
        self.path, self.log, self.load_seconds, self.fail = path, log, load_seconds, fail
        self.release = asyncio.Event()
        self.release.set()
        self.load_fraction = 0.0

    async def start(self) -> None:
        self.log.append(f"load {self.card.id}")
        self.load_fraction = 0.5
        await asyncio.sleep(self.load_seconds)
        if self.fail:
            raise RuntimeError("not a model")

    async def close(self) -> None:
        self.log.append(f"unload {self.card.id}")

    async def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        await self.release.wait()
        yield [Usage(1, 1)]

    def status(self) -> dict[str, object]:
        return {"backend": "llama.cpp", "ready": True}


class World:
    def __init__(self, tmp: Path, **limits: Any) -> None:
        self.tmp, self.residency, self.log = tmp, Residency(**limits), []
        self.engines: dict[str, FakeEngine] = {}

    def model(
        self, name: str, *, keeping: Keeping | None = None, load_seconds: float = 0.0, fail: bool = False
    ) -> ResidentModel:
        path = self.tmp / f"{name}.gguf"
        path.write_bytes(b"GGUF" + bytes(40))  # a header with no keys: the facts say little, the card still lists

        def make() -> Any:
            self.engines[name] = FakeEngine(name, path, self.log, load_seconds, fail)
            return self.engines[name]

        settings = EngineSettings(slots=2, ctx_per_slot=512)
        return ResidentModel(name, path, make, self.residency, settings, keeping or Keeping(), load_wait=1.0)


REQUEST = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


async def answer(model: ResidentModel) -> None:
    async for _ in model.chat(REQUEST, Ticket("r")):
        pass


def test_the_least_recently_used_idle_model_makes_room(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path, max_loaded=2)
        a, b, c = world.model("a"), world.model("b"), world.model("c")
        await answer(a)
        await answer(b)
        await answer(a)  # b is now the least recently used
        await answer(c)
        assert [m.state for m in (a, b, c)] == ["loaded", "unloaded", "loaded"]
        assert world.log == ["load a", "load b", "unload b", "load c"]

    asyncio.run(run())


def test_a_busy_model_is_never_unloaded_and_the_load_waits_for_it(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path, max_loaded=1)
        a, b = world.model("a"), world.model("b")
        await a.load()
        world.engines["a"].release.clear()
        busy = asyncio.create_task(answer(a))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(answer(b))
        await asyncio.sleep(0.05)
        assert (a.state, b.state, a.in_flight) == ("loaded", "unloaded", 1)
        world.engines["a"].release.set()
        await asyncio.gather(busy, waiting)
        assert (a.state, b.state) == ("unloaded", "loaded")

    asyncio.run(run())


def test_concurrent_requests_share_one_load(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path)
        a = world.model("a", load_seconds=0.05)
        await asyncio.gather(*(answer(a) for _ in range(5)))
        assert world.log == ["load a"] and a.loads == 1

    asyncio.run(run())


def test_pinned_models_are_kept_and_a_model_they_leave_no_room_for_is_refused(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path, max_loaded=1)
        pinned, other = world.model("p", keeping=Keeping(pinned=True)), world.model("o")
        await answer(pinned)
        with pytest.raises(Overloaded, match="pinned models fill"):
            await answer(other)
        assert pinned.state == "loaded" and other.state == "unloaded"

    asyncio.run(run())


def test_keep_alive_unloads_an_idle_model_and_a_request_cancels_the_timer(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path)
        now, soon = (
            world.model("now", keeping=Keeping(keep_alive=0)),
            world.model("soon", keeping=Keeping(keep_alive=0.1)),
        )
        await answer(now)
        await answer(soon)
        await asyncio.sleep(0.05)
        assert (now.state, soon.state) == ("unloaded", "loaded")
        await answer(soon)  # used again: its idle time starts over
        await asyncio.sleep(0.07)
        assert soon.state == "loaded"
        await asyncio.sleep(0.1)
        assert soon.state == "unloaded" and soon.unloads == 1

    asyncio.run(run())


def test_a_load_past_the_bound_is_a_503_and_a_failed_load_an_error_that_can_be_retried(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path)
        slow, broken = world.model("slow", load_seconds=1.5), world.model("broken", fail=True)
        with pytest.raises(Overloaded) as refused:
            await answer(slow)
        assert refused.value.headers["Retry-After"] and slow.state == "loading"
        assert slow.status()["load_progress"] == 0.5  # what /health shows while it loads
        await answer(slow)  # the load went on: the retry finds it done
        assert slow.loads == 1
        for _ in range(2):
            with pytest.raises(APIError, match="failed to load"):
                await answer(broken)
        assert broken.state == "unloaded" and world.log.count("load broken") == 2

    asyncio.run(run())


def test_memory_budget_counts_every_model_in_memory(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path, max_memory=250)
        a, b, c = world.model("a"), world.model("b"), world.model("c")
        for model, size in ((a, 100), (b, 100), (c, 100)):
            model.memory_estimate = size
        await answer(a)
        await answer(b)
        await answer(c)  # 300 > 250: a, the least recently used, goes
        assert [m.state for m in (a, b, c)] == ["unloaded", "loaded", "loaded"]

    asyncio.run(run())


def test_a_request_keep_alive_wins_over_the_models_until_a_request_without_one(tmp_path: Path) -> None:
    async def run() -> None:
        world = World(tmp_path)
        model = world.model("m")  # the model's own keep_alive: never unload
        asking = REQUEST.model_copy(update={"keep_alive": 0.0})
        async for _ in model.chat(asking, Ticket("r")):
            pass
        await asyncio.sleep(0.05)
        assert model.state == "unloaded"
        await answer(model)
        await asyncio.sleep(0.05)
        assert model.state == "loaded"

    asyncio.run(run())


def test_two_models_in_one_seat_take_turns_without_unloading_each_other_before_their_requests_run(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        world = World(tmp_path, max_loaded=1)
        a, b = world.model("a", load_seconds=0.01), world.model("b", load_seconds=0.01)
        await asyncio.wait_for(asyncio.gather(*(answer(m) for m in (a, b) * 4)), timeout=5)
        assert a.loads + b.loads <= 4  # each load served its waiting requests before the other model took the seat

    asyncio.run(run())
