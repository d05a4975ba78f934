"""An exception a route raised, as the answer the client gets: the API's error body in the path's dialect."""

from __future__ import annotations

import logging

from starlette.responses import Response

from tokenrelay.auth.dialects import Dialects
from tokenrelay.errors import APIError

log = logging.getLogger(__name__)


def failure_response(dialects: Dialects, path: str, exc: Exception) -> Response:
    """An `APIError` as itself; anything else as a 500 whose details go to the log only."""
    if not isinstance(exc, APIError):
        log.error("unhandled error on %s", path, exc_info=exc)
        exc = APIError("The server had an error while processing your request.")
    return dialects.error(path, exc)
