"""Request ids: generated ones are distinct version-4 UUIDs; only UUIDs are passed on to nodes."""

from __future__ import annotations

import uuid

from tokenrelay.backends.upstream.members import trace_headers
from tokenrelay.requestid import new_request_id


def test_generated_ids_are_distinct_version_4_uuids() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        parsed = uuid.UUID(request_id)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, request_id)


def test_only_uuids_reach_a_node() -> None:
    ours, dashed = new_request_id(), str(uuid.uuid4()).upper()
    assert trace_headers(ours) == {"X-Request-ID": ours}
    assert trace_headers(dashed) == {"X-Request-ID": dashed}
    for other in ("client-chosen-id", ours + "0", ours[:-1], dashed + "\n", ""):
        assert trace_headers(other) == {}
