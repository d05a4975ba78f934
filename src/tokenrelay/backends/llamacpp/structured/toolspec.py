"""What a chat request asks of tool calling, with the legacy `functions` API mapped onto `tools`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from tokenrelay.backends.llamacpp.structured.schemas import NO_ARGUMENTS, check_schema
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.chat import ChatCompletionRequest, FunctionDef, NamedFunction, NamedToolChoice


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The functions the model may call and how it must choose.

    `choice` is "auto" (the model decides), "required" (at least one call) or the name of the one function
    to call. `legacy` requests came through `functions`/`function_call` and are answered with
    `message.function_call` and finish_reason `function_call`.
    """

    functions: tuple[FunctionDef, ...]
    choice: str
    parallel: bool
    legacy: bool = False

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    @property
    def callable(self) -> tuple[FunctionDef, ...]:
        """The functions the grammar lets the model call (only the named one under a named choice)."""
        if self.choice in ("auto", "required"):
            return self.functions
        return tuple(f for f in self.functions if f.name == self.choice)

    @property
    def finish_reason(self) -> str:
        return "function_call" if self.legacy else "tool_calls"


def arguments_schema(function: FunctionDef) -> dict[str, Any]:
    """The schema a call's arguments follow; OpenAI reads a missing `parameters` as "takes no arguments"."""
    return function.parameters if function.parameters is not None else NO_ARGUMENTS


def tool_spec(request: ChatCompletionRequest) -> ToolSpec | None:
    """None when no call can be produced (no tools, or a `none` choice); 400s for requests that cannot work."""
    if request.tools and request.functions:
        raise InvalidRequest("Send either `tools` or the legacy `functions`, not both.", param="functions")
    if request.tools:
        functions = tuple(tool.function for tool in request.tools)
        _check_functions(functions, "tools")
        return _spec(functions, request.tool_choice, request.parallel_tool_calls is not False, legacy=False)
    if request.functions:
        _check_functions(tuple(request.functions), "functions")
        # The legacy API answers with a single `function_call`, so at most one call is generated.
        return _spec(tuple(request.functions), request.function_call, False, legacy=True)
    return None


def _spec(
    functions: tuple[FunctionDef, ...],
    choice: str | NamedToolChoice | NamedFunction | None,
    parallel: bool,
    legacy: bool,
) -> ToolSpec | None:
    if choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        choice = choice.function.name
    elif isinstance(choice, NamedFunction):
        choice = choice.name
    # A named choice means one call of that function, as the OpenAI API answers it.
    return ToolSpec(functions, choice or "auto", parallel and choice in (None, "auto", "required"), legacy)


def _check_functions(functions: tuple[FunctionDef, ...], param: str) -> None:
    seen: set[str] = set()
    for i, function in enumerate(functions):
        where = f"{param}.{i}.function" if param == "tools" else f"{param}.{i}"
        if function.name in seen:
            raise InvalidRequest(f"Function names must be unique; `{function.name}` appears twice.", param=where)
        seen.add(function.name)
        if function.lark is not None:
            _check_lark(function.name, function.lark)
            continue
        what = f"The parameters of `{function.name}`"
        check_schema(arguments_schema(function), f"{where}.parameters", what, lenient=True)


def _check_lark(name: str, grammar: str) -> None:
    """400 unless llguidance reads the Lark grammar of a text call (its dialect of Lark: `docs/syntax.md` there)."""
    failed, messages = LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_lark(grammar))
    if failed:
        raise InvalidRequest(
            f"The Lark grammar of the custom tool `{name}` cannot be enforced: {'; '.join(messages)}",
            param="tools",
            code="invalid_grammar",
        )
