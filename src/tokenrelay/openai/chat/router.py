"""`POST /v1/chat/completions`: the route, its body's schema and its answers in /openapi.json.

The body is read and validated by the endpoint itself (`api/parsing.py`), strictly and with the API's 400s,
so FastAPI is only told its schema.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.api.direct_route import DirectRoute
from tokenrelay.apidoc.operations import answers, json_body
from tokenrelay.openai.chat.serving import ChatEndpoint
from tokenrelay.openai.serving import GENERATION_ERRORS, handle
from tokenrelay.protocol.chat import ChatCompletionRequest

router = APIRouter(route_class=DirectRoute)
ENDPOINT = ChatEndpoint()


@router.post(
    "/v1/chat/completions",
    summary="Create chat completion",
    operation_id="create_chat_completion",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=answers(
        "A chat.completion object, or with `stream: true` its chunks (SSE, ending with [DONE]).", GENERATION_ERRORS
    ),
)
async def create_chat_completion(request: Request) -> Response:
    return await handle(request, ENDPOINT)
