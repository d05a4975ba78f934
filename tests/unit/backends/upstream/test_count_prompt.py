"""A model served by nodes alone counts a chat prompt as the ledger estimates one, and says it is an estimate."""

from __future__ import annotations

import asyncio

from tokenrelay.backends.tokens import ApproxCounter, prompt_tokens
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import RoutingSettings
from tokenrelay.protocol.chat import ChatCompletionRequest


def test_a_node_only_model_counts_with_the_ledgers_estimate() -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]}
    )
    backend = RoutedBackend("m", RoutingSettings(), [])
    count = asyncio.run(backend.count_chat_prompt(request))
    assert count.estimated
    assert count.tokens == prompt_tokens(request, ApproxCounter()) > 0
