"""Request ids: generated ones are distinct, time-ordered version-7 UUIDs; only UUIDs are passed on to nodes."""

from __future__ import annotations

import time
import uuid

from tokenrelay.backends.upstream.members import trace_headers
from tokenrelay.calls.request_ids import new_request_id


def test_generated_ids_are_distinct_version_7_uuids_in_time_order() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_request_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        parsed = uuid.UUID(request_id)
        assert (parsed.version, parsed.variant, parsed.hex) == (7, uuid.RFC_4122, request_id)
        assert before <= parsed.int >> 80 <= after  # the first 48 bits: Unix time in milliseconds
    # Ordered by the millisecond they were made in (within one millisecond the random bits decide).
    millis = [uuid.UUID(i).int >> 80 for i in ids]
    assert millis == sorted(millis)


def test_only_uuids_reach_a_node() -> None:
    ours, dashed = new_request_id(), str(uuid.uuid4()).upper()
    assert trace_headers(ours) == {"X-Request-ID": ours}
    assert trace_headers(dashed) == {"X-Request-ID": dashed}
    for other in ("client-chosen-id", ours + "0", ours[:-1], dashed + "\n", ""):
        assert trace_headers(other) == {}
