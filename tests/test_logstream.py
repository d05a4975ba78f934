"""The stderr handler: request lines leave once per event-loop turn on the loop's thread; all else at once."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

from tokenrelay.logstream import LoopTurnHandler, flush_log_handlers


class CountingFile(io.RawIOBase):
    """A file that remembers each write it was given (what reaches the descriptor, one system call each)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes.append(bytes(data))
        return len(data)

    @property
    def text(self) -> str:
        return b"".join(self.writes).decode()


DEFERRED = "test.logstream.requests"


def handler_over(raw: CountingFile) -> LoopTurnHandler:
    stream = io.TextIOWrapper(io.BufferedWriter(raw, 64 * 1024), encoding="utf-8")
    handler = LoopTurnHandler(stream, deferred=[DEFERRED])
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


def logger_with(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_records_of_one_loop_turn_leave_in_one_write_when_the_turn_ends() -> None:
    raw = CountingFile()
    log = logger_with(handler_over(raw), DEFERRED)

    async def scenario() -> None:
        for i in range(50):
            log.info("line %d", i)
        assert raw.writes == []  # nothing yet: the turn that logged is still running
        await asyncio.sleep(0)
        assert len(raw.writes) == 1
        assert raw.text == "".join(f"line {i}\n" for i in range(50))
        log.info("next turn")
        await asyncio.sleep(0)
        assert raw.writes[1:] == [b"next turn\n"]

    asyncio.run(scenario())


def test_records_outside_a_loop_and_from_other_threads_are_written_at_once() -> None:
    raw = CountingFile()
    log = logger_with(handler_over(raw), DEFERRED)
    log.info("no loop")
    assert raw.writes == [b"no loop\n"]

    async def scenario() -> None:
        thread = threading.Thread(target=log.info, args=("from a thread",))
        thread.start()
        thread.join()
        assert raw.writes[-1] == b"from a thread\n"  # while the loop's turn is still running

    asyncio.run(scenario())


def test_flush_log_handlers_writes_what_a_turn_left_behind() -> None:
    raw = CountingFile()
    handler = handler_over(raw)
    log = logger_with(handler, DEFERRED)
    root = logging.getLogger()
    root.addHandler(handler)
    try:

        async def scenario() -> None:
            log.info("last words")
            flush_log_handlers()  # what the app's lifespan does as it ends, before the loop turns again
            assert raw.writes == [b"last words\n"]

        asyncio.run(scenario())
    finally:
        root.removeHandler(handler)


def test_other_loggers_records_are_written_at_once_taking_the_held_lines_with_them() -> None:
    """A process may end inside a loop turn (uvicorn re-raises SIGTERM there): its closing lines, from other
    loggers, must not wait for a turn that never comes, nor leave request lines behind."""
    raw = CountingFile()
    handler = handler_over(raw)
    requests = logger_with(handler, DEFERRED)
    server = logger_with(handler, "test.logstream.server")

    async def scenario() -> None:
        requests.info("request 1")
        requests.info("request 2")
        assert raw.writes == []
        server.info("Finished server process")
        assert raw.writes == [b"request 1\nrequest 2\nFinished server process\n"]

    asyncio.run(scenario())
