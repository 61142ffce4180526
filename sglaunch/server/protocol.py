"""Request bodies of the OpenAI-compatible and SGLang-native routes (pydantic models).

Fields we cannot honour are refused with a 400 naming the parameter instead of being
silently ignored (`n` > 1, top logprobs, penalties, tools, structured output).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

StopField = Union[str, list[str], None]
# Limits of what the engine can represent or run without slowing every other request down;
# docs/http-api.md lists them.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 512  # stop matching rescans up to this many held-back characters per token
MAX_STOP_TOKEN_IDS = 1024  # every generated token is checked against all of them
MAX_TOP_K = 2**31 - 1  # int32, as sampling kernels hold it; above the vocabulary size it keeps every token
MAX_TEMPERATURE = 1e6  # float32 on the device; 0 is greedy
# torch.Generator.manual_seed accepts [-2**63, 2**64)
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]
LONE_SURROGATE = "lone_surrogate"  # pydantic error type; its ctx names the offending field


def lone_surrogate_path(value: Any) -> str | None:
    """Dotted path ("messages.0.content") of the first string (or key) holding a lone UTF-16
    surrogate, which no tokenizer and no UTF-8 response can carry; None when there is none.

    Iterative, so a deeply nested body cannot exhaust the interpreter's stack.
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _encodes_as_utf8(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not key.isascii() and not _encodes_as_utf8(key):
                    return child_path.encode("utf-8", "backslashreplace").decode()
                stack.append((child, child_path))
        elif isinstance(item, list) and item and not isinstance(item[0], int):
            # NOTE: token-id lists are skipped (pydantic refuses a string inside one anyway)
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(item))
    return None


def _encodes_as_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class RequestBody(BaseModel):
    """Base of every request body: text anywhere in it must be valid Unicode (no lone surrogates)."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        path = lone_surrogate_path(data)
        if path is not None:
            raise PydanticCustomError(
                LONE_SURROGATE, "contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF "
                "escape), which is not valid Unicode text; send the character itself or a valid "
                "surrogate pair", {"param": path})
        return data


def _refuse_unless(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_stop(value: StopField) -> StopField:
    stops = [value] if isinstance(value, str) else (value or [])
    _refuse_unless(len(stops) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings")
    _refuse_unless(all(len(stop) <= MAX_STOP_STRING_CHARS for stop in stops),
                   f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters")
    return value


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class CommonSampling(RequestBody):
    """Sampling fields and checks every generation route shares (OpenAI and native)."""

    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=MAX_TOP_K)  # SGLang extension on the OpenAI routes
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # SGLang extension on the OpenAI routes
    seed: Seed | None = None
    stop: StopField = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int) -> int:
        _refuse_unless(value == 1, "only n=1 is supported (one choice per request)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_limit(cls, value: StopField) -> StopField:
        return _check_stop(value)

    @field_validator("top_k")
    @classmethod
    def _top_k_not_zero(cls, value: int) -> int:
        _refuse_unless(value != 0, "top_k must be -1 (off) or at least 1")
        return value


class OpenAISampling(CommonSampling):
    """Sampling fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float) -> float:
        _refuse_unless(value == 0.0, "penalties are not supported; leave it at 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict | None) -> dict | None:
        _refuse_unless(not value, "logit_bias is not supported")
        return value

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


PromptField = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(OpenAISampling):
    prompt: PromptField
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        _refuse_unless(not value, "echo is not supported")
        return value

    @field_validator("logprobs")
    @classmethod
    def _chosen_token_logprobs_only(cls, value: int | None) -> int | None:
        _refuse_unless(value in (None, 0), "only logprobs=0 (log-probabilities of the chosen "
                       "tokens, no alternatives) is supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        _refuse_unless(value in (None, 1), "only best_of=1 is supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        _refuse_unless(not value, "suffix is not supported")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: PromptField) -> PromptField:
        _refuse_unless(value != [] and value != [[]], "prompt must not be empty")
        return value


class ChatMessage(BaseModel):
    """One chat message; unknown keys (e.g. reasoning_content) pass through to the template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value):
        if isinstance(value, list):
            for part in value:
                _refuse_unless(part.get("type") == "text" and isinstance(part.get("text"), str),
                               "only text content parts are supported")
        return value

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it (text parts joined into one string)."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(part["text"] for part in self.content)
        message.setdefault("content", "")
        return message


class ChatCompletionRequest(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # SGLang extension (e.g. enable_thinking)
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        _refuse_unless(not value, "top_logprobs are not supported; logprobs=true returns the "
                       "chosen tokens' log-probabilities")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list | None) -> list | None:
        _refuse_unless(not value, "tool calling is not supported")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_format_only(cls, value: dict | None) -> dict | None:
        _refuse_unless(value is None or value.get("type") == "text",
                       "structured output (json_object, json_schema) is not supported")
        return value

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class NativeSamplingParams(CommonSampling):
    """`sampling_params` of SGLang's POST /generate (the subset the engine runs)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_new_tokens: int = Field(default=128, ge=1)
    sampling_seed: Seed | None = None  # SGLang's name for the per-request seed


class NativeGenerateRequest(RequestBody):
    """Body of SGLang's POST /generate: `text` or `input_ids`, one prompt or a batch."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    rid: Union[str, list[str], None] = None
    return_logprob: bool = False  # output tokens' log-probabilities in meta_info
    top_logprobs_num: int = 0

    @field_validator("top_logprobs_num")
    @classmethod
    def _no_top_logprobs(cls, value: int) -> int:
        _refuse_unless(value == 0, "top_logprobs_num is not supported")
        return value


def stop_strings(stop: StopField) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)
