"""One settings tree: config file (YAML) < environment (TOKENRELAY_*) < command-line flags."""

from __future__ import annotations

import os
import re
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    SecretStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from tokenrelay.durations import KeepAlive
from tokenrelay.models.source import parse_source
from tokenrelay.nodeurl import NodeUrl

# Served when no model is configured: a base model for completions and an instruct model for chat.
DEFAULT_MODEL_IDS = ("gemma-3-270m", "smollm2-135m-instruct")
DEFAULT_BASE_MODELS = frozenset({"gemma-3-270m"})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def usable_cpus(most: int) -> int:
    """The CPUs this process may run on (its affinity: `taskset`, a container's cpuset), at most `most`.
    llama.cpp's threads spin while they wait for each other, so a thread per CPU the process cannot use makes
    every step slower, not faster."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, most))


class EngineSettings(BaseModel):
    """Embedded llama.cpp engine knobs; the defaults suit a 2-core machine and the default model."""

    model_config = ConfigDict(extra="forbid")

    threads: int = Field(default_factory=lambda: usable_cpus(most=8), ge=1)
    # 20: sixteen for batch lines (a step's cost grows in jumps with its width, and 16 sequences make the most
    # tokens per second on two cores) while `interactive_slots` stay free for requests.
    slots: int = Field(default=20, ge=1, le=256, description="sequences decoded together in one context")
    ctx_per_slot: int = Field(default=1024, ge=64, description="KV cells available to each sequence")
    # A long slot holds a whole agent conversation (Codex CLI sends ~5.5k tokens, Claude Code ~21k): one by default,
    # since its cells are allocated when first used (about 120 MiB for 32k cells of the default Gemma model, whose
    # sliding-window layers keep their window only).
    long_slots: int = Field(
        default=1,
        ge=0,
        le=16,
        description="sequences with the model's whole context (up to max_context), for requests a slot of "
        "ctx_per_slot cannot hold (0: none)",
    )
    long_kv_type: Literal["q8_0", "f16"] = Field(
        default="f16", description="a long slot's KV cache precision (f16: prompts evaluate about twice as fast)"
    )
    # llama.cpp's CPU flash attention visits the cache key by key for each head: with small heads (SmolLM2's 64
    # dimensions) a step at 9k tokens of context took 4x as long as the plain matrix products (docs/benchmarks.md).
    long_flash_attention: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="flash attention in a long slot (auto: on for attention heads of 128 dimensions or more)",
    )
    # Gemma 3's 32k long slot: 118 MiB with its window against 581 MiB with every cell (docs/benchmarks.md).
    long_window: bool = Field(
        default=True,
        description="a long slot's sliding-window layers keep only their window (false: every cell, as the short "
        "slots do); either way an answer does not depend on what ran before it, and a window costs less memory and "
        "time at long contexts",
    )
    # A long slot's steps are a function of its one sequence, so there llama.cpp's repacked weights (rows taken four
    # at a time) stay batch-invariant.
    long_repack: bool = Field(
        default=False,
        description="a long slot computes with the weights this CPU repacks (Q4_0, Q4_K, IQ4_NL on x86 with AVX2) in "
        "llama.cpp's repacked layouts: a second load of the model file, whose other weights share its pages. Off by "
        "default: its prompts are no faster than with the tiled kernel prompt pieces take (`kernels`), only than "
        "with the row-by-row one of builds that cannot choose kernels pass by pass",
    )
    max_context: int | None = Field(
        default=None,
        ge=64,
        description="KV cells of a long slot (default: the model's trained context, at most 32768); more than the "
        "model was trained on is allowed, and answers past its trained context degrade",
    )
    prefill_chunk: int = Field(
        default=512, ge=8, le=4096, description="prompt tokens evaluated per step at most (beside the decoding streams)"
    )
    # Between the short slots' steps, a long prompt's piece of 512 tokens stalls every stream for a second or more
    # on two cores; beside them, on a core of its own, it stalls none (docs/benchmarks.md).
    long_prompt_beside: bool = Field(
        default=True,
        description="a long slot's prompt evaluates on one thread beside the short slots' decoding (which keep the "
        "other threads) instead of between their steps: streams keep flowing, the long prompt takes longer",
    )
    queue_size: int = Field(default=64, ge=0, description="requests waiting for a slot before 503")
    # 3: on two cores a lone sequence's step costs about a fifth more per extra row up to four rows, then jumps.
    draft_tokens: int = Field(
        default=3,
        ge=0,
        le=16,
        description="prompt-lookup guesses a step of few sequences checks beside their next tokens, filling it up to "
        "1 + draft_tokens rows (0: off); outputs are unchanged, repeated text takes fewer steps",
    )
    interactive_slots: int = Field(
        default=4,
        ge=0,
        description="slots background work (batch lines) leaves free; an interactive request that finds none free "
        "takes one from background work anyway, whose line runs again later",
    )
    embedding_batch: int = Field(
        default=64, ge=1, le=256, description="inputs embedded together in one decode (up to ctx_per_slot tokens)"
    )
    embedding_decode_tokens: int = Field(
        default=256,
        ge=16,
        description="tokens per embedding decode of a model pooled here (a longer input is embedded alone, in pieces)",
    )
    batch_invariant: bool = Field(
        default=True,
        description="one matrix kernel for every batch shape (process-wide: the first model loaded decides)",
    )
    # Over an F16 K cache a short slot's prompt pieces take llama.cpp's tiled attention, still batch-invariant where
    # prompt pieces and decoding steps take kernels of their own (`kernels`, `Lane.block`): a ~500-token prompt
    # evaluates ~8% faster than over Q8_0, for ~100 MiB more per default model (docs/benchmarks.md).
    kv_type: Literal["q8_0", "f16"] = Field(
        default="f16",
        description="the short slots' K cache precision (q8_0: half the K cache's memory, prompts evaluate ~8% "
        "slower; without kernels chosen pass by pass f16 is not batch-invariant)",
    )
    # The attention kernel follows the K cache's type: with a quantised K every row takes the row-by-row kernel,
    # whatever V is. An F16 V is accumulated as it is rather than dequantised cell by cell: prompts in the short
    # slots evaluate about 15% faster (docs/benchmarks.md), for twice the V cache's memory.
    v_type: Literal["q8_0", "f16"] = Field(
        default="f16", description="the short slots' V cache precision (f16: faster prompts, still batch-invariant)"
    )
    kv_unified: bool = Field(default=False, description="one KV buffer for all sequences (breaks batch invariance)")
    # Residency: read from the top-level `engine` only (they bound the process, not one model).
    max_loaded_models: int | None = Field(
        default=None, ge=1, description="engine models loaded at once; loading one more unloads the least recently used"
    )
    max_memory: ByteSize | None = Field(
        default=None,
        description='memory for loaded engine models (weights + KV cache, e.g. "4GiB"); loading past it unloads the '
        "least recently used idle ones",
    )
    keep_alive: KeepAlive = Field(
        default=-1, description="seconds an idle engine model stays loaded (0: unload after each answer; -1: always)"
    )
    load_wait: float = Field(
        default=300.0, gt=0, description="seconds a request waits for its model to load before a 503 with Retry-After"
    )
    repack_weights: bool = Field(
        default=False,
        description="llama.cpp's repacked CPU weight layouts: multi-row kernels that break batch invariance",
    )


_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
# Credentials and the rest of the URL in visible ASCII (non-ASCII is percent-encoded), spelled out as ranges: `\s`
# and `\S` differ between the document's regex dialect and pydantic's (U+0085 is a space in one only).
_USERINFO = r"[\x21\x22\x24-\x2e\x30-\x3e\x41-\x5a\x5c\x5e-\x7e]+"  # visible ASCII but / ? # @ [ ]
# The URL's shape, for the API document; what is between an IPv6 literal's brackets is judged by the standard
# library (`node_url_problem`), which knows every form RFC 3986 allows.
_NODE_URL = rf"^https?://({_USERINFO}@)?([A-Za-z0-9._~%-]+|\[[0-9A-Fa-f:.]+\])(:{_PORT})?([/?#][\x21-\x7e]*)?$"


def node_url_problem(url: str) -> str | None:
    """What is wrong with a node URL that has the right shape (`_NODE_URL`), or None."""
    try:
        NodeUrl.parse(url)
    except ValueError as exc:
        return str(exc)
    return None


# A key sent in a request header: visible ASCII characters, no spaces or line breaks.
HEADER_TOKEN = r"^[!-~]+$"


def decimal_amount(digits: int) -> Any:
    """A non-negative decimal with at most `digits` digits before its point, as a JSON number or a string of ASCII
    digits (exact: `"0.15"` is 0.15). Its schema states exactly what validation accepts, so an API document's
    reader (or a fuzzer) never meets a documented value that is refused."""
    below = 10**digits
    pattern = rf"^\+?[0-9]{{1,{digits}}}(\.[0-9]+)?$"
    schema = {
        "anyOf": [
            {"type": "number", "minimum": 0, "exclusiveMaximum": below},
            {"type": "string", "pattern": pattern},
        ]
    }

    def exact(value: Any) -> Any:
        """The decimal a number or digit string reads as (a float by its shortest spelling: 0.15 is 0.15), which
        also passes strict validation; anything else is left for the type's own refusal."""
        if isinstance(value, str):
            if re.fullmatch(pattern, value) is None:
                raise ValueError(f"write the amount as a number or as digits with an optional point (below 1e{digits})")
            return Decimal(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return Decimal(str(value))
        return value

    # Written back in plain digits (never `1E-7`), so a stored amount reads back as the same value.
    plain = PlainSerializer(lambda amount: format(amount, "f"), return_type=str, when_used="json")
    return Annotated[Decimal, BeforeValidator(exact), Field(ge=0, lt=below), WithJsonSchema(schema), plain]


# A price per million tokens: below a billion, so a call's cost in micro-units fits the ledger's 64-bit column.
if TYPE_CHECKING:  # a type built at run time: the checker sees what validation makes of it
    Price = Decimal
else:
    Price = decimal_amount(9)


class Pricing(BaseModel):
    """What a model's tokens cost, per million, in the settings' `currency`. Prices are decimals, so a price such
    as 0.15 is exactly 0.15 (costs are computed in integer micro-units: `pricing/cost.py`)."""

    model_config = ConfigDict(extra="forbid")

    input: Price = Field(description="per million prompt tokens")
    cached_input: Price | None = Field(
        default=None, description="per million prompt tokens read from a cache (default: the input price)"
    )
    output: Price = Field(description="per million completion tokens")

    @property
    def cached(self) -> Decimal:
        return self.input if self.cached_input is None else self.cached_input


class UpstreamSettings(BaseModel):
    """One OpenAI-compatible node serving a model (its base URL ends where `/chat/completions` is appended)."""

    model_config = ConfigDict(extra="forbid")

    # A host (a name, IPv4 or a bracketed IPv6 address), an optional port and path: what `NodeUrl` takes apart.
    url: str = Field(pattern=_NODE_URL)
    name: str | None = Field(default=None, min_length=1, description="label in logs and status (default: host:port)")
    model: str | None = Field(default=None, description="the node's own name for the model (default: the id)")
    api_key: SecretStr | None = Field(
        default=None, json_schema_extra={"pattern": HEADER_TOKEN}, description="sent as `Authorization: Bearer`"
    )
    weight: float = Field(default=1.0, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)
    completions_via_chat: bool = Field(default=False, description="serve /v1/completions through the node's chat")
    native_apis: list[Literal["responses", "messages"]] = Field(
        default_factory=list,
        description="APIs the node serves itself; requests to them are relayed as sent, only model rewritten",
    )
    pricing: Pricing | None = Field(default=None, description="this node's prices (default: the model's)")

    @field_validator("url")
    @classmethod
    def _has_host(cls, url: str) -> str:
        problem = node_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("api_key")
    @classmethod
    def _fits_a_header(cls, key: SecretStr | None) -> SecretStr | None:
        # pydantic applies no `pattern` to a SecretStr, so the schema's pattern is checked here.
        if key is not None and re.fullmatch(HEADER_TOKEN, key.get_secret_value()) is None:
            raise ValueError("the key goes into a request header: printable ASCII without spaces")
        return key

    @property
    def node_url(self) -> NodeUrl:
        return NodeUrl.parse(self.url)

    @property
    def label(self) -> str:
        return self.name or self.node_url.authority


class UpstreamTimeouts(BaseModel):
    """Seconds. First byte and idle gap apply to streams; a non-streamed answer is bounded by `overall`."""

    model_config = ConfigDict(extra="forbid")

    connect: float = Field(default=5.0, gt=0)
    first_byte: float = Field(default=120.0, gt=0, description="request sent → first chunk (queueing, prefill)")
    idle: float = Field(default=60.0, gt=0, description="largest gap between two chunks of a stream")
    overall: float = Field(default=900.0, gt=0)


class UpstreamHealth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    probe_interval: float = Field(default=10.0, ge=0, description="seconds between active probes; 0 turns them off")
    probe_path: str = Field(default="/models", description="GET under the node's URL; 2xx means healthy")
    probe_timeout: float = Field(default=5.0, gt=0)
    unhealthy_after: int = Field(default=2, ge=1, description="consecutive failed probes that mark a node down")
    breaker_failures: int = Field(default=5, ge=1, description="consecutive request failures that open the breaker")
    breaker_cooldown: float = Field(default=30.0, gt=0, description="seconds open before one trial request")


class PrefixAffinity(BaseModel):
    """Send prompts sharing a long prefix to the same node (its KV cache), unless that node is busier."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    prefix_chars: int = Field(default=2048, ge=64, description="prompts at least this long are keyed by this prefix")
    max_load_gap: float = Field(
        default=2.0, ge=0, description="in-flight requests per unit weight the preferred node may exceed the least"
    )


class RoutingSettings(BaseModel):
    """How a model's upstream nodes are chosen, watched and failed over."""

    model_config = ConfigDict(extra="forbid")

    timeouts: UpstreamTimeouts = Field(default_factory=UpstreamTimeouts)
    health: UpstreamHealth = Field(default_factory=UpstreamHealth)
    affinity: PrefixAffinity = Field(default_factory=PrefixAffinity)
    max_attempts: int = Field(default=3, ge=1, description="nodes tried for one request before giving up")
    # Read from the top-level `routing:` only: registrations are a property of the server, not of one model.
    registry_sync_seconds: float = Field(
        default=2.0, gt=0, description="seconds between reloads of the nodes registered through /admin/nodes"
    )


class AccountingSettings(BaseModel):
    """Keys, ledger and limits: how long things may be cached or batched, and what a reservation assumes."""

    model_config = ConfigDict(extra="forbid")

    key_cache_seconds: float = Field(
        default=3.0, ge=0, description="how long a verified key is trusted before the database is asked again"
    )
    ledger_flush_seconds: float = Field(default=0.25, gt=0, description="longest a ledger row waits to be written")
    ledger_batch_size: int = Field(
        default=200, ge=1, description="rows queued that have the writer write at once, before the interval is up"
    )
    ledger_max_rows: int = Field(
        default=2000,
        ge=1,
        description="most rows in one transaction: a writer that fell behind under load catches up in large ones",
    )
    ledger_inline_sqlite: bool = Field(
        default=True,
        description="write SQLite ledger rows on the event loop (usage/inline.py); false: through the driver's thread",
    )
    reservation_ttl_seconds: float = Field(
        default=3600.0, gt=0, description="a budget reservation older than this is released (its replica died)"
    )
    default_context_tokens: int = Field(
        default=32768, ge=1, description="completion tokens reserved when neither max_tokens nor the context is known"
    )


class ResponsesSettings(BaseModel):
    """The Responses API's stored responses (`store: true`), kept in the same database as the usage ledger."""

    model_config = ConfigDict(extra="forbid")

    retention_days: float | None = Field(
        default=30.0, gt=0, description="days a stored response is kept; null keeps them until deleted"
    )
    sweep_seconds: float = Field(default=3600.0, gt=0, description="seconds between removals of expired responses")


class BatchSettings(BaseModel):
    """The Batch API (`/v1/files`, `/v1/batches`): limits of input files and how batches run."""

    model_config = ConfigDict(extra="forbid")

    max_file_bytes: int = Field(default=200 << 20, ge=1, description="largest file `/v1/files` accepts (413 above)")
    max_lines: int = Field(default=50_000, ge=1, description="most request lines one batch input file may hold")
    concurrency: int = Field(
        default=16, ge=1, description="batch lines one server process runs at once (interactive requests come first)"
    )
    lease_seconds: float = Field(
        default=120.0, gt=0, description="a claimed line whose server stops renewing it for this long runs again"
    )
    poll_seconds: float = Field(default=1.0, gt=0, description="how often a server looks for batch work")
    window_seconds: float = Field(
        default=86_400.0, gt=0, description="what the `24h` completion window lasts on this server"
    )
    output_retention_days: float | None = Field(
        default=30.0, gt=0, description="days the files a batch writes are kept; null keeps them until deleted"
    )


class TelemetrySettings(BaseModel):
    """OpenTelemetry traces, exported over OTLP/HTTP; off until an endpoint is set."""

    model_config = ConfigDict(extra="forbid")

    otlp_endpoint: str | None = Field(
        default=None, description="the collector's OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces"
    )
    sample_ratio: float = Field(default=1.0, ge=0, le=1, description="share of new traces recorded")
    capture_content: bool = Field(default=False, description="put prompts and completions on spans")
    service_name: str = Field(default="tokenrelay", min_length=1)


class ModelSettings(BaseModel):
    """A model id clients use, served by a GGUF file in-process and/or by upstream nodes."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    path: Path | None = None
    source: str | None = Field(
        default=None,
        description="where the GGUF comes from: hf:org/repo[:quant or file], pulled through huggingface_hub",
    )
    chat_template: Path | None = None
    engine: EngineSettings | None = None
    upstreams: list[UpstreamSettings] = Field(default_factory=list)
    routing: RoutingSettings | None = None
    embeddings: bool = Field(default=True, description="serve /v1/embeddings for this model")
    chat: bool = Field(
        default=True,
        description="an instruct (chat) model; false for a base model, served for completions: the playground opens "
        "on a chat model",
    )
    pricing: Pricing | None = Field(default=None, description="prices per million tokens; none: the model costs 0")
    fallbacks: list[str] = Field(
        default_factory=list,
        description="models that serve a request, in order, when none of this model's members can before its first "
        "byte (down, breaker open, 429/5xx, queue full)",
    )
    context_fallbacks: list[str] = Field(
        default_factory=list, description="models that serve, in order, a prompt longer than this model's context"
    )
    embeddings_truncatable: bool = Field(
        default=False,
        description="its embeddings keep their meaning when cut short (Matryoshka training): allows `dimensions`",
    )
    pin: bool = Field(default=False, description="an engine model that stays loaded whatever the residency limits")
    on_demand: bool = Field(default=False, description="an engine model loaded on its first request, not at start")
    keep_alive: KeepAlive | None = Field(
        default=None, description="seconds this engine model stays loaded when idle (default: engine.keep_alive)"
    )

    @property
    def embedded(self) -> bool:
        """Whether this model runs on the embedded llama.cpp engine (alone or next to nodes)."""
        return self.path is not None or self.source is not None or not self.upstreams

    @field_validator("source")
    @classmethod
    def _source_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_source(value)
        return value

    @model_validator(mode="after")
    def _has_a_backend(self) -> ModelSettings:
        if self.path is not None and self.source is not None:
            raise ValueError(f"model {self.id!r} has both a GGUF `path` and a `source`; keep one")
        if self.path is None and self.source is None and not self.upstreams and self.id not in DEFAULT_MODEL_IDS:
            raise ValueError(f"model {self.id!r} needs a GGUF `path`, a Hub `source` or at least one upstream")
        return self

    @model_validator(mode="after")
    def _node_names_unique(self) -> ModelSettings:
        labels = [upstream.label for upstream in self.upstreams]
        for label in labels:
            if labels.count(label) > 1:
                raise ValueError(f"model {self.id!r}: two upstreams are called {label!r}; give them distinct `name`s")
        return self


def fallback_problem(models: list[ModelSettings]) -> str | None:
    """What is wrong with the models' fallback ids (an unknown id, a model its own fallback, a cycle), or None."""
    known = {model.id: model for model in models}
    for model in models:
        for target in (*model.fallbacks, *model.context_fallbacks):
            if target not in known:
                return f"model {model.id!r}: fallback {target!r} is not a configured model"
    for model in models:
        cycle = _fallback_cycle(model.id, known, [])
        if cycle is not None:
            return "fallbacks form a cycle: " + " -> ".join(cycle)
    return None


def _fallback_cycle(model_id: str, known: dict[str, ModelSettings], path: list[str]) -> list[str] | None:
    if model_id in path:
        return [*path[path.index(model_id) :], model_id]
    model = known[model_id]
    for target in (*model.fallbacks, *model.context_fallbacks):
        cycle = _fallback_cycle(target, known, [*path, model_id])
        if cycle is not None:
            return cycle
    return None


def fallback_chain(model_id: str, models: list[ModelSettings]) -> list[str]:
    """Every model that may serve a request for `model_id`, itself first: its fallbacks and context fallbacks and
    theirs, each once (what a reservation bounds the cost by)."""
    known = {model.id: model for model in models}
    chain: list[str] = []
    pending = [model_id]
    while pending:
        current = pending.pop(0)
        if current in chain:
            continue
        chain.append(current)
        settings = known.get(current)
        if settings is not None:
            pending.extend([*settings.fallbacks, *settings.context_fallbacks])
    return chain


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tokenrelay"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENRELAY_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    models: list[ModelSettings] = Field(default_factory=list)
    chat_template: Path | None = None
    engine: EngineSettings = Field(default_factory=EngineSettings)
    max_n: int = Field(default=16, ge=1, description="largest `n` / `best_of` a request may ask for")
    currency: str = Field(
        default="USD", pattern=r"^[A-Z]{3}$", description="the currency of every price and money budget (ISO 4217)"
    )
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"
    admin_key: SecretStr | None = None
    metrics_require_admin: bool = Field(default=False, description="serve /metrics only with the admin key")
    api_key: SecretStr | None = Field(default=None, description="a static key accepted on /v1 (no limits)")
    database_url: str | None = Field(default=None, description="sqlite:///path or postgresql://...; default: data dir")
    redis_url: str | None = Field(
        default=None,
        pattern=r"^(redis|rediss|unix)://",
        description="redis://host:port/db: requests and tokens per minute counted there, shared by every replica",
    )
    insecure_no_auth: bool = Field(default=False, description="allow serving without keys on a non-loopback address")
    shutdown_timeout: float = Field(default=30.0, ge=0, description="seconds in-flight requests get on shutdown")
    workers: int = Field(default=1, ge=1, le=256, description="server processes sharing the port (upstream-only)")
    accounting: AccountingSettings = Field(default_factory=AccountingSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    batches: BatchSettings = Field(default_factory=BatchSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    models_dir: Path | None = Field(
        default=None, description="a folder of GGUF files, each served (loaded on demand) under its file name's stem"
    )
    _found_models: list[ModelSettings] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _fallbacks_known_and_acyclic(self) -> Settings:
        problem = fallback_problem(self.served_models())
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _scan_models_dir(self) -> Settings:
        if self.models_dir is not None:
            if not self.models_dir.is_dir():
                raise ValueError(f"models_dir {str(self.models_dir)!r} is not a folder")
            self._found_models = models_in(self.models_dir, self.models)
        return self

    def served_models(self) -> list[ModelSettings]:
        """Configured models, then those found in `models_dir`; the default models when there are neither."""
        return (self.models + self._found_models) or self._default_models()

    @staticmethod
    def _default_models() -> list[ModelSettings]:
        return [ModelSettings(id=model_id, chat=model_id not in DEFAULT_BASE_MODELS) for model_id in DEFAULT_MODEL_IDS]

    def engine_for(self, model: ModelSettings) -> EngineSettings:
        return model.engine or self.engine

    def routing_for(self, model: ModelSettings | None) -> RoutingSettings:
        return (model.routing if model is not None else None) or self.routing


# Not models of their own: a multimodal projector, and the later parts of a split GGUF (llama.cpp opens the first).
_SPLIT_SUFFIX = re.compile(r"-00001-of-\d{5}$", re.IGNORECASE)
_NOT_A_MODEL = re.compile(r"(mmproj|-0000[2-9]-of-|-000[1-9]\d-of-)", re.IGNORECASE)


def models_in(folder: Path, configured: list[ModelSettings]) -> list[ModelSettings]:
    """A model per GGUF in `folder` (its id the file name's stem, lowercased) that no configured model already
    serves by path or id; each is loaded on its first request."""
    taken_ids = {model.id for model in configured}
    taken_paths = {model.path.resolve() for model in configured if model.path is not None}
    found = []
    for path in sorted(folder.glob("*.gguf")):
        model_id = _SPLIT_SUFFIX.sub(
            "", path.stem
        ).lower()  # a split GGUF is named after its first part, less the count
        if _NOT_A_MODEL.search(path.name) or model_id in taken_ids or path.resolve() in taken_paths:
            continue
        taken_ids.add(model_id)
        found.append(ModelSettings(id=model_id, path=path, on_demand=True))
    return found


def expand_env(value: Any) -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in every string of a loaded config file."""
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def read_config_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config file must hold a mapping at its top level")
    return expand_env(data)


def load_settings(config_file: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Layer the config file under the environment under `overrides` (the command line)."""
    config_file = config_file or _env_config_file()
    file_values = read_config_file(config_file)

    class LayeredSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=file_values)

    return LayeredSettings(**(overrides or {}))


def _env_config_file() -> Path | None:
    value = os.environ.get("TOKENRELAY_CONFIG")
    return Path(value) if value else None
