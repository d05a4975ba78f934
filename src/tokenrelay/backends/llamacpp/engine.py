"""The embedded engine as a `Backend`: requests → jobs for the scheduler → events for the renderer."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import llama_cpp

from tokenrelay import __version__
from tokenrelay.backends.base import (
    ENGINE_KIND,
    Embeddings,
    Event,
    Events,
    ModelCard,
    PromptCount,
    TextDelta,
    Ticket,
    TokenLogprob,
    Usage,
)
from tokenrelay.backends.llamacpp import prompts, spans
from tokenrelay.backends.llamacpp.choices import Candidate, PromptRun, partial_usage, translate
from tokenrelay.backends.llamacpp.cpu import (
    RepackVerdict,
    cpu_report,
    invariance_key,
    keep_invariance,
    kept_invariance,
    repack_verdict,
)
from tokenrelay.backends.llamacpp.embedder import Embedder, embedder_for, embedding_status
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, JobFailed, PromptScored
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.pooling import is_encoder_only
from tokenrelay.backends.llamacpp.sampling_plans import seq_plans
from tokenrelay.backends.llamacpp.scheduler import Scheduler
from tokenrelay.backends.llamacpp.structured.constraint import GrammarConstraint
from tokenrelay.backends.llamacpp.structured.plan import OutputPlan, output_plan
from tokenrelay.backends.llamacpp.structured.toolprompt import tool_prompt
from tokenrelay.backends.llamacpp.structured.toolstream import tool_events
from tokenrelay.backends.llamacpp.structured.vocabulary import GrammarVocabulary
from tokenrelay.backends.llamacpp.templates import ChatTemplate, template_for
from tokenrelay.backends.llamacpp.textstream import TextStream
from tokenrelay.backends.llamacpp.thinking import opened_by, thinking_events
from tokenrelay.config import EngineSettings
from tokenrelay.errors import APIError, InvalidRequest
from tokenrelay.observability.progress import Progress
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)
T = TypeVar("T")


class LlamaCppBackend:
    """A GGUF model served in-process with continuous batching."""

    kind = ENGINE_KIND

    def __init__(
        self,
        model_id: str,
        path: Path,
        engine: EngineSettings,
        chat_template: Path | None = None,
        probe_dir: Path | None = None,
        embeddings: bool = True,
        repo_template: Callable[[], str | None] | None = None,
    ) -> None:
        self.card = ModelCard(id=model_id, owned_by="tokenrelay", created=int(path.stat().st_mtime))
        self.path = path
        self.engine_settings = engine
        self.template_override = chat_template
        self.repo_template = repo_template  # the model repository's template, asked for when the GGUF has none
        self.model: LlamaModel | None = None
        self.template: ChatTemplate | None = None
        self.scheduler: Scheduler | None = None
        self.vocabulary: GrammarVocabulary | None = None
        self.probe_dir = probe_dir  # where the repacking check keeps its verdicts (None: not kept)
        self.embeddings = embeddings
        self.embedder: Embedder | None = None
        self.embeddings_only = False  # an encoder GGUF (BERT and kin): no generation
        self.repacked = False
        self.load_fraction = 0.0  # of the weights read, while loading (`/health` of a model loaded on demand)
        self.repack_verdict: RepackVerdict | None = None
        self.cpu: dict[str, object] = {}  # what /health says of the kernels, fixed once the model is loaded
        self._fingerprint = self.fingerprint_of(path)

    @staticmethod
    def fingerprint_of(path: Path) -> str:
        stat = path.stat()
        source = f"{path.name}:{stat.st_size}:{__version__}:{llama_cpp.__version__}"
        return "fp_" + hashlib.sha256(source.encode()).hexdigest()[:10]

    # Lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        if self.embedder is not None:
            self.embedder.start()

    def _load(self) -> None:
        log.info("loading model %s from %s", self.card.id, self.path)
        progress = Progress(f"loading model {self.card.id}", log)

        def loaded_so_far(fraction: float) -> None:
            progress.update(fraction)
            self.load_fraction = fraction

        self.repacked = self._repacking_allowed()
        model = LlamaModel(
            self.path,
            repack_weights=self.repacked,
            on_progress=loaded_so_far,
            batch_invariant=self.engine_settings.batch_invariant,
        )
        self.cpu = cpu_report(self.repacked, self.repack_verdict)
        self.embeddings_only = is_encoder_only(model)
        self.embedder = embedder_for(self.card.id, model, self.engine_settings) if self.embeddings else None
        if self.embeddings_only:
            self._loaded_for_embeddings(model)
            return
        source, origin = template_for(
            model.architecture, model.chat_template, self.template_override, self.repo_template
        )
        bos, eos = model.special("bos"), model.special("eos")
        self.template = ChatTemplate(
            source,
            origin,
            bos_token=model.token_text(bos) if bos is not None else "",
            eos_token=model.token_text(eos) if eos is not None else "",
        )
        # The invariance probe decodes for seconds; its verdict is kept per machine, build, model and setup, so
        # a model loaded again (on demand, or at the next start) serves at once.
        probe = invariance_key(self.path, self._probe_setup())
        self.scheduler = Scheduler(model, self.engine_settings, kept_invariance(self.probe_dir, probe))
        self.scheduler.start()
        if self.scheduler.kernels_invariant:  # a failed probe (or a failed check) is measured again next time
            keep_invariance(self.probe_dir, probe, invariant=True)
        self.vocabulary = GrammarVocabulary(model)
        self.model = model
        # Known only once the context exists; admission uses it to bound a request without max_tokens.
        contexts = tuple(sorted({lane.cells for lane in self.scheduler.lanes}))
        self.card = replace(self.card, context_length=self.scheduler.n_ctx, slot_contexts=contexts)
        log.info(
            "model %s ready: %s, chat template %s, slots %s, weights %s; llama.cpp %s",
            self.card.id,
            model.architecture,
            origin,
            " + ".join(f"{len(lane.slots)} x {lane.cells} tokens" for lane in self.scheduler.lanes),
            "repacked" if self.repacked else "not repacked",
            self.cpu["build_features"],
        )

    def _loaded_for_embeddings(self, model: LlamaModel) -> None:
        if self.embedder is None:
            raise RuntimeError(f"model {self.card.id} is an embedding model and has embeddings turned off")
        self.embedder.open()  # embedding is all it does: a context that cannot be made fails the load
        self.model = model
        self.card = replace(self.card, context_length=self.embedder.shape.max_tokens)
        log.info("model %s ready: %s, an embedding model (no generation)", self.card.id, model.architecture)

    def _probe_setup(self) -> dict[str, object]:
        """The settings the invariance probe's outcome depends on (beside the machine, build and model file)."""
        settings = self.engine_settings
        fields: tuple[str, ...] = ("threads", "slots", "ctx_per_slot", "prefill_chunk")
        fields += ("kv_type", "v_type", "kv_unified", "batch_invariant")
        # the probe's steps beside others run with a thread less when long prompts evaluate beside them
        setup: dict[str, object] = {name: getattr(settings, name) for name in fields}
        return setup | {"long_prompt_beside": settings.long_prompt_beside, "repacked": self.repacked}

    def _repacking_allowed(self) -> bool:
        """Repacked weights only when configured and a child process has decoded with them here (see `cpu`)."""
        if not self.engine_settings.repack_weights:
            return False
        self.repack_verdict = repack_verdict(self.path, self.probe_dir)
        if not self.repack_verdict.safe:
            reason = self.repack_verdict.detail.removeprefix("failed: ")
            log.warning("model %s: repack_weights is on but %s; serving without repacking", self.card.id, reason)
        return self.repack_verdict.safe

    async def close(self) -> None:
        if self.embedder is not None:
            await self.embedder.close()
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self.model is not None:
            self.model.close()

    def ready(self) -> bool:
        return self.model is not None

    def fingerprint(self) -> str:
        return self._fingerprint

    def status(self) -> dict[str, object]:
        if self.model is None:
            return {"backend": "llama.cpp", "ready": False}
        embedding = embedding_status(self.embedder)
        if self.scheduler is None:
            return {"backend": "llama.cpp", "ready": True, "cpu": self.cpu, **embedding}
        stats = self.scheduler.stats
        lanes = [lane.status() for lane in self.scheduler.lanes]
        return {
            "backend": "llama.cpp",
            "ready": True,
            "slots": len(self.scheduler.slots),
            "busy_slots": self.scheduler.busy_slots,
            "queue_depth": self.scheduler.queue_depth,
            "context_length": self.n_ctx,
            "lanes": lanes,
            "cells": sum(lane["cells"] for lane in lanes),
            "cells_in_use": sum(lane["cells_in_use"] for lane in lanes),
            "kernel_invariance_probe": self.scheduler.kernels_invariant,
            "cpu": self.cpu,
            "steps": stats.steps,
            "prompt_tokens_evaluated": stats.prompt_tokens_evaluated,
            "tokens_generated": stats.tokens_generated,
            "aborted_steps": stats.aborted_steps,
            "pieces_beside": stats.pieces_beside,
            "prefix_copies": stats.prefix_copies,
            "drafted_tokens": stats.drafted_tokens,
            "accepted_drafts": stats.accepted_drafts,
            "decode_seconds": round(stats.decode_seconds, 3),
            "step_seconds": round(stats.step_seconds, 3),
            **embedding,
        }

    # What `_load` made: requests reach a backend only once it is ready, generation only on a generating model.
    @property
    def _model(self) -> LlamaModel:
        return self._loaded(self.model, "model")

    @property
    def _scheduler(self) -> Scheduler:
        return self._loaded(self.scheduler, "scheduler")

    @property
    def _template(self) -> ChatTemplate:
        return self._loaded(self.template, "chat template")

    @property
    def _vocabulary(self) -> GrammarVocabulary:
        return self._loaded(self.vocabulary, "grammar vocabulary")

    def _loaded(self, part: T | None, name: str) -> T:
        if part is None:
            raise RuntimeError(f"model {self.card.id} has no {name} loaded")
        return part

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_special=add_special, parse_special=True)

    def detokenize(self, tokens: list[int]) -> str:
        prompts.check_token_ids(self._model, tokens, "tokens")
        return self._model.detokenize(tokens)

    @property
    def n_ctx(self) -> int:
        return self._scheduler.n_ctx

    # Requests -----------------------------------------------------------------------------------
    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        self._check_generates()
        prompts.reject_media(request)
        return one_by_one(self._chat(request, ticket))

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        """The tokens `chat(request)` would evaluate as its prompt: the same template, tools and tokenizer."""
        return PromptCount(len(await self.chat_tokens(request)))

    async def chat_tokens(self, request: ChatCompletionRequest, *, opened: bool = True) -> list[int]:
        """The prompt `chat(request)` would evaluate (without `opened`: the conversation with no answer begun)."""
        prompts.reject_media(request)
        tokens, _ = await self._chat_prompt(request, opened)
        return tokens

    async def _chat_prompt(self, request: ChatCompletionRequest, opened: bool = True) -> tuple[list[int], OutputPlan]:
        # Checking schemas and tools compiles grammars: milliseconds usually, up to a second for a huge schema,
        # so it runs off the event loop. Errors still come before the first event, so they stay plain 400s.
        output = await asyncio.to_thread(output_plan, request)
        messages, tools = tool_prompt(prompts.template_messages(request), output.tools, self._template.takes_tools)
        continued = request.continue_final_message
        prompt = prompts.chat_prompt(self._model, self._template, messages, tools, continued, opened)
        return prompt, output

    async def _chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncGenerator[Event, None]:
        tokens, output = await self._chat_prompt(request)
        limit = request.token_limit
        max_tokens = limit if limit is not None else self.n_ctx - len(tokens)
        self._check(request, len(tokens), max_tokens, "messages")
        top = (request.top_logprobs or 0) if request.logprobs else None
        run = PromptRun(tokens=tokens, first_index=0)
        events = self._generate(request, ticket, [run], max_tokens, top, request.choices, None, output.grammar, limit)
        if output.grammar is None and self._template.thinks:  # a grammar leaves no room for thinking
            opened = opened_by(self._model.detokenize(tokens[-8:]))
            events = thinking_events(events, opened, self._model.count)
        if output.tools is not None:
            events = tool_events(events, output.tools)
        async with aclosing(events):
            async for event in events:
                yield event

    def complete(self, request: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        self._check_generates()
        runs = [self._completion_run(request, prompt, i * request.choices) for i, prompt in enumerate(request.prompts)]
        max_tokens = request.token_limit
        for run in runs:
            self._check(request, len(run.tokens), max_tokens, "prompt")
        if request.candidates > self.engine_settings.slots:
            raise InvalidRequest(
                f"best_of may be at most {self.engine_settings.slots} for this model.", param="best_of"
            )
        prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
        return one_by_one(
            self._generate(
                request,
                ticket,
                runs,
                max_tokens,
                request.logprobs,
                request.candidates,
                prompt_logprobs,
                None,
                max_tokens,
            )
        )

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        if self.embedder is None:
            raise InvalidRequest(f"The model `{self.card.id}` serves no embeddings.", param="model")
        return await self.embedder.embed(request)

    def _check_generates(self) -> None:
        if self.embeddings_only:
            raise InvalidRequest(
                f"The model `{self.card.id}` is an embedding model: it serves /v1/embeddings only.", param="model"
            )

    def _completion_run(self, request: CompletionRequest, prompt: str | list[int], first: int) -> PromptRun:
        if isinstance(prompt, str):
            tokens = prompts.text_prompt(self._model, prompt, request.suffix)
            echo = prompt
        else:
            if request.suffix is not None:
                raise InvalidRequest("`suffix` needs a text prompt, not token ids.", param="suffix")
            prompts.check_token_ids(self._model, prompt, "prompt")
            tokens, echo = list(prompt), self._model.detokenize(prompt)
        bos = self._model.special("bos")
        skip = 1 if isinstance(prompt, str) and bos is not None and tokens and tokens[0] == bos else 0
        if not tokens:
            tokens, skip = [self._document_start()], 1
        return PromptRun(tokens=tokens, first_index=first, echo_text=echo if request.echo else None, echo_from=skip)

    def _document_start(self) -> int:
        """What an empty prompt starts from: a document boundary, as OpenAI starts one from its end-of-text
        token (BOS where the model has one, else its end-of-sequence token)."""
        for name in ("bos", "eos"):
            token = self._model.special(name)
            if token is not None:
                return token
        message = "The prompt is empty and this model has no BOS or EOS token to start from."
        raise InvalidRequest(message, param="prompt")

    def _check(self, request: GenerationRequest, n_prompt: int, max_tokens: int, prompt_param: str) -> None:
        prompts.check_context(n_prompt, max_tokens, self.n_ctx, prompt_param)
        prompts.check_logit_bias(self._model, request)
        if request.choices > self.engine_settings.slots:
            raise InvalidRequest(f"n may be at most {self.engine_settings.slots} for this model.", param="n")

    # Generation ---------------------------------------------------------------------------------
    async def _generate(
        self,
        request: GenerationRequest,
        ticket: Ticket,
        runs: list[PromptRun],
        max_tokens: int,
        top: int | None,
        best_of: int,
        prompt_logprobs: int | None,
        grammar: str | None,
        limit: int | None,
    ) -> AsyncGenerator[Event, None]:
        """`limit` is the request's own max_tokens (None: it set none, so a sequence may fill its slot)."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        ranked = best_of > request.choices
        jobs = []
        for number, run in enumerate(runs):
            offset = len(run.echo_text) if run.echo_text is not None else 0
            constraints = await self._constraints(grammar, best_of) if grammar is not None else None
            plans = seq_plans(request, best_of, max_tokens, top, ranked, run.first_index, offset, constraints)

            def sink(event: object, number: int = number) -> None:
                loop.call_soon_threadsafe(inbox.put_nowait, (number, event))

            jobs.append(
                Job(
                    run.tokens,
                    plans,
                    sink,
                    prompt_logprobs=prompt_logprobs,
                    echo_from=run.echo_from,
                    background=ticket.background,
                    max_tokens=limit,
                )
            )
        finished = False
        tracer = ticket.tracer
        span = spans.generation_span(tracer, self.card.id, ticket.background) if tracer is not None else None
        submitted_ns = time.time_ns()
        try:
            for job in jobs:
                self._scheduler.submit(job)
            async for event in self._events(runs, jobs, inbox, request.choices, ranked, prompt_logprobs):
                yield event
            finished = True
        finally:
            for job in jobs:
                job.cancel()
            if not finished:
                ticket.consumed = partial_usage(jobs)
            if tracer is not None and span is not None:
                spans.end_generation(tracer, span, jobs, submitted_ns)

    async def _constraints(self, grammar: str, count: int) -> list[GrammarConstraint]:
        """One grammar state per sequence. Compiling a large grammar can take a while, so it runs off the loop;
        the copies share the compiled grammar."""
        tokenizer = await self._vocabulary.tokenizer()
        try:
            first = await asyncio.to_thread(GrammarConstraint.build, tokenizer, grammar, self._model.n_vocab)
        except ValueError as exc:  # checked up front, so only a resource limit of llguidance gets here
            raise InvalidRequest(f"The output grammar cannot be enforced: {exc}") from exc
        return [first, *(first.copy() for _ in range(count - 1))]

    async def _events(
        self,
        runs: list[PromptRun],
        jobs: list[Job],
        inbox: asyncio.Queue[tuple[int, object]],
        n: int,
        ranked: bool,
        prompt_logprobs: int | None,
    ) -> AsyncIterator[Event]:
        usage = Usage()
        pools: list[dict[int, Candidate]] = [{} for _ in runs]
        if prompt_logprobs is None:
            for number, run in enumerate(runs):
                for echoed in self._echo(run, jobs[number], []):
                    for out in translate(echoed, run, pools[number], ranked, n):
                        yield out
        remaining = len(jobs)
        while remaining:
            number, event = await inbox.get()
            run = runs[number]
            if isinstance(event, JobFailed):
                raise APIError(event.message, status=event.status)
            if isinstance(event, JobDone):
                remaining -= 1
                usage.prompt_tokens += event.prompt_tokens
                usage.completion_tokens += event.completion_tokens
                usage.cached_tokens += event.cached_tokens
            events = self._echo(run, jobs[number], event.entries) if isinstance(event, PromptScored) else [event]
            for item in events:
                for out in translate(item, run, pools[number], ranked, n):
                    yield out
        yield usage

    def _echo(self, run: PromptRun, job: Job, entries: list[TokenLogprob]) -> list[TextDelta]:
        if run.echo_text is None:
            return []
        offsets = TextStream([])
        placed = []
        for entry in entries:
            placed.extend(offsets.feed(bytes(entry.bytes or []), entry).logprobs)
        placed.extend(offsets.flush().logprobs)
        return [TextDelta(plan.index, run.echo_text, placed) for plan in job.seqs]


async def one_by_one(events: AsyncGenerator[Event, None]) -> AsyncIterator[Events]:
    """The engine's events as batches of one: it releases a token's events as soon as they are sampled."""
    async with aclosing(events):
        async for event in events:
            yield [event]
