"""Client request → the JSON body a node receives.

Every field the client sent is forwarded, unknown extras included (the protocol models keep them); `model` is
rewritten to the node's name, and the completion limit is sent as `max_tokens`, the one name vLLM, SGLang,
llama.cpp's server, llama-cpp-python's server and Ollama all read (llama-cpp-python ignores
`max_completion_tokens`), with the completions API's default of 16 written out so every node makes as many
tokens. Streams ask the node for usage so the ledger has real counts; the client gets the usage chunk only if it
asked (the renderer decides, from the client's own request).
"""

from __future__ import annotations

from typing import Any

from tokenrelay.backends.upstream.cutoff import token_limit
from tokenrelay.errors import UNSUPPORTED_PARAMETER, InvalidRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest

# Completion fields that have no chat equivalent; a node serving completions through chat cannot honour them.
_COMPLETION_ONLY = ("prompt", "echo", "suffix", "best_of", "logprobs")


def node_body(request: GenerationRequest, node_model: str) -> dict[str, Any]:
    body = request.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return _finish(body, request, node_model)


def completion_as_chat(request: CompletionRequest, node_model: str) -> dict[str, Any]:
    """A text completion asked of a node that only has `/chat/completions`: the prompt becomes one user turn."""
    _check_chat_expressible(request)
    body = request.model_dump(mode="json", by_alias=True, exclude_unset=True)
    for name in _COMPLETION_ONLY:
        body.pop(name, None)
    body["messages"] = [{"role": "user", "content": request.prompt}]
    if request.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = request.logprobs
    return _finish(body, request, node_model)


def _finish(body: dict[str, Any], request: GenerationRequest, node_model: str) -> dict[str, Any]:
    body["model"] = node_model
    body.pop("max_completion_tokens", None)
    limit = token_limit(request)
    if limit is not None:
        body["max_tokens"] = limit
    stream = bool(request.stream)
    if body.get("continue_final_message"):
        body["add_generation_prompt"] = False  # vLLM refuses the continuation with its default `true`
    if stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def _check_chat_expressible(request: CompletionRequest) -> None:
    if not isinstance(request.prompt, str):
        raise InvalidRequest(
            "This model serves completions through a chat endpoint: send one text prompt.", param="prompt"
        )
    if request.echo:
        raise InvalidRequest("`echo` is not available for this model.", param="echo", code=UNSUPPORTED_PARAMETER)
    if request.suffix is not None:
        raise InvalidRequest("`suffix` is not available for this model.", param="suffix", code=UNSUPPORTED_PARAMETER)
    if request.best_of is not None and request.best_of > request.choices:
        raise InvalidRequest(
            "`best_of` greater than `n` is not available for this model.", param="best_of", code=UNSUPPORTED_PARAMETER
        )
