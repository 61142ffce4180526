"""Tokenizer, chat templates, incremental detokenization and stop strings for the HTTP server.

The tokenizer is loaded straight from the checkpoint's `tokenizer.json` with the `tokenizers`
library, so the `tokenizer_class` named in `tokenizer_config.json` (e.g. transformers 5's
`TokenizersBackend`, or classes an older transformers does not know) does not matter. Only a
folder without `tokenizer.json` falls back to transformers' `AutoTokenizer`. Torch-free.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, Sequence

from sglaunch.errors import SglaunchError

logger = logging.getLogger(__name__)

# Prompt tokens decoded together with the first output tokens, so that a leading space
# (SentencePiece "▁", byte-level "Ġ") of the first output token survives decoding.
DETOKENIZE_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BUILTIN_CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE}


class TokenizerBackend(Protocol):
    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...
    def vocab_size(self) -> int: ...


class _FastBackend:
    """`tokenizers.Tokenizer` loaded from tokenizer.json."""

    def __init__(self, tokenizer_json: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # NOTE: encode_batch releases the GIL while it works (encode holds it throughout), so a
        # long prompt tokenized on a worker thread does not stall the event loop
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def decode_stream(self, prefix_ids: Sequence[int], skip_special_tokens: bool):
        """(step, tokenizer): the library's incremental decoder (tokenizers.decoders.DecodeStream)
        primed with `prefix_ids`, or None where this tokenizers version has none."""
        try:
            from tokenizers.decoders import DecodeStream

            stream = DecodeStream(ids=list(prefix_ids), skip_special_tokens=skip_special_tokens)
        except (ImportError, TypeError):  # older tokenizers: no DecodeStream, or no `ids`
            return None
        return stream.step, self._tok


class _TransformersBackend:
    """transformers `AutoTokenizer`, for folders without tokenizer.json (e.g. only a .model file)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer  # launch-time only: heavy import

        self._tok = AutoTokenizer.from_pretrained(str(folder))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._tok.convert_tokens_to_ids(token)
        return None if token_id == self._tok.unk_token_id and token != self._tok.unk_token else token_id

    def vocab_size(self) -> int:
        return len(self._tok)


@dataclass(frozen=True)
class SpecialTokens:
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    add_bos: bool = False  # tokenizer_config's add_bos_token: prepend BOS if tokenizer.json does not


@dataclass
class ServerTokenizer:
    """Encode prompts, decode outputs and render chat prompts for one checkpoint."""

    backend: TokenizerBackend
    special: SpecialTokens = field(default_factory=SpecialTokens)
    chat_template: str | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens)
        bos_id = self.bos_token_id
        if add_special_tokens and self.special.add_bos and bos_id is not None:
            if not ids or ids[0] != bos_id:
                ids = [bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens)

    def decode_stream(self, prefix_ids: Sequence[int], skip_special_tokens: bool = True):
        """The backend's incremental decoder, or None (IncrementalDetokenizer then decodes)."""
        make = getattr(self.backend, "decode_stream", None)
        return make(prefix_ids, skip_special_tokens) if make is not None else None

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size()

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id(self.special.bos)

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id(self.special.eos)

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """Render chat messages to the prompt text; raises ValueError without a template."""
        if self.chat_template is None:
            raise ValueError(
                "This model has no chat template; start the server with --chat-template "
                "or use /v1/completions.")
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.special.bos or "", eos_token=self.special.eos or "",
            pad_token=self.special.pad or "", unk_token=self.special.unk or "",
            **template_kwargs)

    def encode_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        """Chat prompt token ids; the template writes BOS itself, so no special tokens are added."""
        return self.encode(self.render_chat(messages, **template_kwargs), add_special_tokens=False)

    @cached_property
    def _compiled_template(self):
        return compile_chat_template(self.chat_template or "")


# ---------------------------------------------------------------- loading


def load_tokenizer(folder: str | Path, chat_template: str | None = None) -> ServerTokenizer:
    """Load the tokenizer and chat template of a checkpoint folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SglaunchError(f"Tokenizer folder not found: {folder}",
                            hint="Pass a local checkpoint folder as --model-path or --tokenizer-path.")
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    backend = _load_backend(folder)
    template = resolve_chat_template(folder, tokenizer_config, chat_template)
    tokenizer = ServerTokenizer(backend, _special_tokens(tokenizer_config), template)
    if template is not None:
        _check_template_compiles(tokenizer)
    return tokenizer


def _check_template_compiles(tokenizer: ServerTokenizer) -> None:
    """A broken template fails at start-up, not on every chat request."""
    from jinja2 import TemplateSyntaxError

    try:
        tokenizer._compiled_template
    except TemplateSyntaxError as exc:
        raise SglaunchError(f"The chat template does not compile: {exc} (line {exc.lineno})",
                            hint="Fix the template or pass another one with --chat-template.") from exc


def _load_backend(folder: Path) -> TokenizerBackend:
    tokenizer_json = folder / "tokenizer.json"
    if tokenizer_json.is_file():
        return _FastBackend(tokenizer_json)
    try:
        return _TransformersBackend(folder)
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear error
        raise SglaunchError(
            f"Could not load a tokenizer from {folder}: {exc}",
            hint="The folder needs tokenizer.json (or files transformers' AutoTokenizer reads).",
        ) from exc


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SglaunchError(f"{path} is not valid JSON: {exc}") from exc


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as serialized AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(tokenizer_config: dict[str, Any]) -> SpecialTokens:
    return SpecialTokens(
        bos=_token_text(tokenizer_config.get("bos_token")),
        eos=_token_text(tokenizer_config.get("eos_token")),
        pad=_token_text(tokenizer_config.get("pad_token")),
        unk=_token_text(tokenizer_config.get("unk_token")),
        add_bos=bool(tokenizer_config.get("add_bos_token", False)),
    )


def resolve_chat_template(folder: Path, tokenizer_config: dict[str, Any],
                          override: str | None) -> str | None:
    """The chat template: --chat-template, else tokenizer_config.json, chat_template.jinja/.json."""
    if override:
        return _template_from_override(override)
    template = _pick_default_template(tokenizer_config.get("chat_template"))
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (folder / "chat_template.json").is_file():
        template = _pick_default_template(_read_json(folder / "chat_template.json").get("chat_template"))
    return template


def _template_from_override(override: str) -> str:
    path = Path(override).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            template = _pick_default_template(json.loads(text).get("chat_template"))
            if template is None:
                raise SglaunchError(f"{path} has no chat_template entry.")
            return template
        return text
    if override in BUILTIN_CHAT_TEMPLATES:
        return BUILTIN_CHAT_TEMPLATES[override]
    raise SglaunchError(
        f"Chat template not found: {override}",
        hint=f"Pass a .jinja or .json file, or a built-in name: {', '.join(BUILTIN_CHAT_TEMPLATES)}.")


def _pick_default_template(value: Any) -> str | None:
    """A template string, or the 'default' entry of a list of named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def compile_chat_template(source: str):
    """Compile a Hugging Face chat template with the same Jinja settings transformers uses."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _raise_template_error(message: str):
    raise ValueError(f"Chat template error: {message}")


# ---------------------------------------------------------------- detokenization


class IncrementalDetokenizer:
    """Turn a growing list of output token ids into text deltas that are always valid UTF-8.

    Decodes a short window `ids[prefix_offset:]` and returns what it adds beyond
    `ids[prefix_offset:read_offset]`. A delta ending in U+FFFD means a multi-byte character is
    still incomplete, so it is held back until more tokens arrive (or `flush`).

    With the `tokenizers` backend the window is decoded by the library's DecodeStream, the same
    rule in one call per chunk instead of two decodes and two slices (issue 15: once per token
    per stream); offsets are kept here too, for `flush` and for the plain path, which takes over
    if the library refuses a window (its prefix check is stricter than this class's).
    """

    def __init__(self, tokenizer: ServerTokenizer, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-DETOKENIZE_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self.ids)
        stream = None
        # NOTE: a prompt that ends inside a character: DecodeStream's prefix check reads that
        # differently from the plain path, which keeps such requests
        if not tokenizer.decode(self.ids, skip_special_tokens).endswith(REPLACEMENT_CHAR):
            stream = tokenizer.decode_stream(self.ids, skip_special_tokens)
        self._step, self._backend_tokenizer = stream if stream is not None else (None, None)

    def add(self, new_ids: Sequence[int]) -> str:
        """Append tokens; return the text they complete (possibly empty)."""
        if not new_ids:  # NOTE: nothing changed since the last call, which left nothing to emit
            return ""
        self.ids.extend(new_ids)
        if self._step is not None:
            try:
                # NOTE: one id as an int: DecodeStream.step takes it without building a list
                text = self._step(self._backend_tokenizer,
                                  new_ids[0] if len(new_ids) == 1 else list(new_ids))
            except Exception:  # noqa: BLE001 - e.g. an invalid prefix: the plain path decides
                self._step = None
            else:
                if text is None:
                    return ""
                self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
                return text
        prefix_text, full_text = self._decode_window()
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return full_text[len(prefix_text):]

    def flush(self) -> str:
        """Text still held back (an incomplete character decodes to U+FFFD)."""
        prefix_text, full_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self.ids)
        return full_text[len(prefix_text):]

    def _decode_window(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        prefix = decode(self.ids[self._prefix_offset:self._read_offset], self._skip_special)
        full = decode(self.ids[self._prefix_offset:], self._skip_special)
        return prefix, full


class StopStringMatcher:
    """Find stop strings in streamed text without ever emitting part of a stop string.

    Text that could still be the start of a stop string is held back until the next delta
    decides it. Once a stop string is found, the text before it is released and `matched` is set.
    """

    def __init__(self, stop: Sequence[str]):
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add decoded text; return the part that is safe to emit now."""
        if not self._stop:  # NOTE: most requests: nothing to hold back (once per streamed chunk)
            return text
        if self.matched is not None:
            return ""
        buffer = self._held + text
        cut, matched = self._earliest_match(buffer)
        if matched is not None:
            self.matched, self._held = matched, ""
            return buffer[:cut]
        keep = self._longest_partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep]

    def flush(self) -> str:
        """Release held text at the end of generation."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buffer: str) -> tuple[int, str | None]:
        best, matched = len(buffer), None
        for stop in self._stop:
            index = buffer.find(stop)
            if index != -1 and index < best:
                best, matched = index, stop
        return best, matched

    def _longest_partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
