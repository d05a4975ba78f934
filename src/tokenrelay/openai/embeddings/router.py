"""`POST /v1/embeddings`: the route, listed in /openapi.json with its request and answer schemas.

The app's middlewares give it its request id and authenticate it, as for every /v1 path.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.api.direct_route import DirectRoute
from tokenrelay.api.lifecycle import run_call
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.openai.embeddings.protocol import EmbeddingList
from tokenrelay.openai.embeddings.serving import ENDPOINT, respond
from tokenrelay.protocol.embeddings import EmbeddingRequest

router = APIRouter(route_class=DirectRoute)

# The body is read and validated by the endpoint itself (strictly, with OpenAI-style 400s), so FastAPI is
# only told its schema.
_REQUEST_BODY = json_body(EmbeddingRequest)


@router.post(
    "/v1/embeddings",
    summary="Create embeddings",
    response_model=EmbeddingList,
    openapi_extra=_REQUEST_BODY,
    responses=error_responses(400, 404, 413, 429, 502, 503),
)
async def create_embeddings(request: Request) -> Response:
    return await run_call(request, ENDPOINT, respond)
