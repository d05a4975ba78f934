"""The interface every backend implements, and the events it yields.

A backend receives a validated protocol request and yields its events in batches (`Events`): what one read
from a node brought, or one step of the engine; `tokenrelay.openai` renders each batch into JSON or one SSE write
for the client. Keeping the wire format out of backends is what lets the embedded engine and
upstream nodes share one renderer, one ledger and one set of metrics.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tokenrelay.jsonbytes import dumps
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int] | None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position: the chosen token, its logprob (None for the first prompt token) and the alternatives."""

    token: str
    logprob: float | None
    bytes: list[int] | None
    top: list[TopLogprob]
    text_offset: int = 0


@dataclass(slots=True)
class TextDelta:
    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(slots=True)
class TextRun:
    """Plain text deltas of one choice that arrived together (one read from a node), in order.

    The same as one `TextDelta` per text, without logprobs, and rendered as that many chunks. Carried as one
    event so that what one read brought passes the layers between node and client once, and reaches the
    client in one write. Never empty, and no text in it is empty."""

    index: int
    texts: list[str]


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    call_index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class Finish:
    index: int
    reason: str
    stop_sequence: str | None = None  # which stop sequence ended the choice (reason "stop"), when known


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those the model spent in its reasoning
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class DeltaFields:
    """Fields of a node's message or delta that the events above do not model (e.g. `reasoning_content`).

    Relayed as they are, so a gateway in front of a node does not silently drop what the node added.
    """

    index: int
    fields: dict[str, Any]


@dataclass(slots=True)  # not frozen: made per request, and a frozen dataclass's __init__ is dearer
class Served:
    """Who answered: yielded once, just before the first content event, by backends that choose among members."""

    node: str | None  # None: a model's engine alone (a fallback on its engine names no member)
    kind: str
    model: str | None = None  # the fallback model that served, when not the model asked for
    fingerprint: str | None = None  # that fallback's `system_fingerprint`


@dataclass(slots=True)
class Raw:
    """Bytes of a node's answer in the API the client itself asked for (a native relay), passed on unchanged:
    a piece of its event stream as it arrived, or its whole JSON body."""

    data: bytes


@dataclass(slots=True)
class NodeStored:
    """A natively relayed answer that its node keeps under `id` (a Responses object made with `store`): the
    gateway remembers whose it is and which node holds it, to forward later reads of it there."""

    id: str


Event = TextDelta | TextRun | ToolCallDelta | Finish | Usage | DeltaFields | Served | Raw | NodeStored

# The events that arrived together (one node read, one engine event), in order; never empty. A batch passes the
# layers between backend and client once and reaches the client in one write.
Events = list[Event]


@dataclass(frozen=True, slots=True)
class PromptCount:
    """How many tokens a request's prompt is; `estimated` when counted without the model's own template."""

    tokens: int
    estimated: bool = False


Vector = npt.NDArray[np.float32]


@dataclass(slots=True)
class Embeddings:
    """A backend's answer to an embedding request: one vector per input, in input order (the engine's are
    L2-normalised; a node's are as the node sent them).

    `prompt_tokens` is what the inputs cost (the node's count, or the engine's); `served_by` names the member
    that answered, for backends that choose among members (as `Served` does for generation)."""

    vectors: list[Vector]
    prompt_tokens: int
    estimated: bool = False
    served_by: Served | None = None


@dataclass(frozen=True, slots=True)
class ModelCard:
    id: str
    owned_by: str
    created: int
    context_length: int | None = None
    slot_contexts: tuple[int, ...] = ()  # the embedded engine's slot sizes, narrowest first (`room_for`)

    def room_for(self, prompt: int) -> int | None:
        """The most tokens a request without max_tokens may take, prompt and answer, given `prompt` tokens (or a
        bound on them): the slot it would run in (`unlimited_slot`), else the model's context."""
        return unlimited_slot(self.slot_contexts, prompt) or self.context_length


def unlimited_slot(contexts: Sequence[int], prompt: int) -> int | None:
    """The cells of the slot a prompt without max_tokens runs in: the narrowest that the prompt fills at most half
    of (room for the answer), else the widest that holds it; None when none does."""
    holding = sorted(cells for cells in contexts if prompt < cells)
    roomy = [cells for cells in holding if 2 * prompt <= cells]
    return roomy[0] if roomy else (holding[-1] if holding else None)


@dataclass(slots=True)
class Ticket:
    """What a backend is told about the call it serves, besides the request, and what it tells back outside the
    events: a generation closed before its end (client gone, shutdown) yields no final `Usage`, so the backend
    puts what it consumed here on the way out."""

    request_id: str
    background: bool = False  # a batch line: served in the capacity interactive calls leave free
    consumed: Usage | None = None
    # Set when traces are exported; the call's span is the current span while the backend is asked and read.
    tracer: Tracer | None = None


async def aclose_quietly(events: AsyncIterator[object]) -> None:
    """Close a backend's event stream (if it can be closed); a failure of its own cleanup is logged, not raised."""
    aclose = getattr(events, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # the backend's own cleanup failing must not hide the call's real outcome
        log.exception("closing a backend stream failed")


ENGINE_KIND = "llama.cpp"  # the embedded engine's `kind`


class Backend(Protocol):
    """A model's executor: the embedded engine or a set of upstream nodes."""

    card: ModelCard
    kind: str  # "llama.cpp", "upstream", ... (for logs, metrics and the ledger)

    def fingerprint(self) -> str: ...

    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]: ...

    def complete(self, request: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]: ...

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount: ...

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def ready(self) -> bool: ...

    def status(self) -> dict[str, object]: ...


# Capabilities some backends have beyond `Backend`: the API edge asks for them with `isinstance` on these
# protocols, never on a backend's class.

# The APIs a node may serve itself, relayed as the client sent them (`backends/upstream/native.py`).
NativeApi = Literal["responses", "messages"]


@dataclass(frozen=True, slots=True)
class NativeRequest:
    """A request to relay as sent: its API, the client's JSON body, the client's headers the node should get,
    and the same request as chat (what prefix affinity keys on, and what a usage estimate counts); `node` names
    the only node that may answer (the one that keeps the response a request continues)."""

    api: NativeApi
    body: dict[str, Any]
    chat: ChatCompletionRequest
    headers: dict[str, str] = field(default_factory=dict)
    node: str | None = None

    @property
    def path(self) -> str:
        return f"/{self.api}"  # under the node's URL, which ends at /v1

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    def payload(self, node_model: str) -> bytes:
        return dumps({**self.body, "model": node_model})


@runtime_checkable
class NativeRelay(Protocol):
    """A backend whose nodes may answer the Responses or Messages API themselves (a model's nodes, or a call's
    model with fallbacks)."""

    def relays(self, api: NativeApi) -> bool:
        """Whether requests to `api` go to the nodes as sent."""
        ...

    def relay(self, request: NativeRequest, request_id: str) -> AsyncIterator[Events]:
        """The node's answer: `Raw` pieces, then the usage."""
        ...


class NodeStatus(Protocol):
    def status(self) -> dict[str, object]: ...


@runtime_checkable
class NodeBacked(Backend, NativeRelay, Protocol):
    """A model served by upstream nodes, which the gateway can list and ask directly."""

    @property
    def nodes(self) -> Mapping[str, NodeStatus]: ...

    async def fetch(self, node_name: str, method: str, path: str, request_id: str) -> tuple[int, bytes]:
        """The answer of one node to a bodiless request (a read of what it keeps)."""
        ...

    async def count_natively(self, request: NativeRequest, request_id: str) -> int:
        """A node's own count of a request in an API it serves itself."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """A backend with the model's own tokenizer in process (the embedded engine)."""

    @property
    def n_ctx(self) -> int: ...

    def tokenize(self, text: str, add_special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    async def chat_tokens(self, request: ChatCompletionRequest, *, opened: bool = True) -> list[int]: ...


@runtime_checkable
class OnDemand(Protocol):
    """A backend that loads its model when a request needs it (`backends/resident.py`)."""

    async def loaded(self) -> Backend:
        """The backend that serves once the model is loaded (loading it now if it is not)."""
        ...
