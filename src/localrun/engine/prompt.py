"""The one prompt renderer: messages to the text a model reads.

With a chat template, the model's own, always rendered by Jinja (as llama.cpp's --jinja); without one (a
base model), either the messages' text as it is (`raw`: `run`'s plain completion) or a plain transcript
that a stop at the next "User:" ends (chat and the server's chat endpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from ..errors import EngineError

TRANSCRIPT_STOP = "\nUser:"


@dataclass
class Rendered:
    text: str
    stops: list[str] = field(default_factory=list)  # stops the format itself needs (the transcript's)
    templated: bool = True


def render(engine, messages: Sequence[dict], *, raw: bool = False, add_generation_prompt: bool = True,
           tools: Optional[list[dict[str, Any]]] = None, think: Optional[bool] = None) -> Rendered:
    """`raw`: no template, the messages' contents joined (a system message only when raw was asked for
    rather than forced by a missing template is the caller's choice: it passes the messages it wants).
    `think`: turn a reasoning model's thinking on or off where its template has a switch (Qwen3's
    enable_thinking); None leaves the template's default.
    A conversation that ends with the assistant's own text (a client's "continue", a prefilled answer) is
    continued: that message is the end of the prompt, without its end-of-turn and no new turn opened, as
    Ollama and llama.cpp's server render it."""
    if raw:
        return Rendered("\n\n".join(m["content"] for m in messages), templated=False)
    continued = add_generation_prompt and _continues(messages)
    if engine.chat_template is None:
        text = transcript(messages, add_generation_prompt and not continued)
        return Rendered(text.removesuffix("\n") if continued else text, [TRANSCRIPT_STOP], templated=False)
    if continued:
        return Rendered(_continuation(engine, messages, tools, think))
    return Rendered(apply_template(engine, messages, add_generation_prompt, tools, think))


def _continues(messages: Sequence[dict]) -> bool:
    """Does the conversation end with an assistant's text to go on with (not a tool call, not empty)."""
    if not messages:
        return False
    last = messages[-1]
    return last["role"] == "assistant" and bool(last.get("content")) and not last.get("tool_calls")


def _continuation(engine, messages: Sequence[dict], tools, think) -> str:
    """The conversation rendered whole (no generation prompt), cut right after the last message's text: what
    llama.cpp's server does for a prefilled assistant message. A template that rewrites that text (so it
    is not found as written) gets the turn opened as for a new answer, with the text after it."""
    text = apply_template(engine, messages, False, tools, think)
    content = messages[-1]["content"]
    at = text.rfind(content)
    if at >= 0:
        return text[:at + len(content)]
    return apply_template(engine, messages[:-1], True, tools, think) + content


def transcript(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """A plain 'User: ... / Assistant: ...' transcript for a model without a chat template."""
    parts = []
    for m in messages:
        if m["role"] == "system":
            parts.append(m["content"] + "\n\n")
        elif m["role"] == "user":
            parts.append(f"User: {m['content']}\n")
        else:
            parts.append(f"Assistant: {m['content']}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


def apply_template(engine, messages: Sequence[dict], add_generation_prompt: bool = True,
                   tools: Optional[list[dict[str, Any]]] = None, think: Optional[bool] = None) -> str:
    """The model's own chat template, rendered by Jinja for every prompt, as llama.cpp's `--jinja` renders it
    (its built-in renderers for the templates they recognise leave out what the template itself writes:
    Qwen's default system prompt, a reasoning model's opened block, the tools): the same variables, and a
    BOS the template writes left to the tokenizer where it adds one."""
    template = engine.chat_template
    if template is None:
        raise EngineError("this model has no chat template: use --raw for plain completion")
    extra: dict[str, Any] = {}
    if think is not None and "enable_thinking" in template:
        extra["enable_thinking"] = think
    if tools:
        extra["tools"] = tools
    bos, eos = _special_texts(engine)
    try:
        text = _formatter(template, bos, eos)(messages=list(messages), add_generation_prompt=add_generation_prompt, **extra)
    except Exception as exc:  # the template's raise_exception, or a template that does not render
        raise EngineError(f"the model's chat template cannot render these messages: {exc}") from None
    if bos and engine.add_bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def _special_texts(engine) -> tuple[str, str]:
    info = engine.info
    bos = engine.detokenize([info.bos_token_id]) if info.bos_token_id is not None else ""
    eos = engine.detokenize([info.eos_token_id]) if info.eos_token_id is not None else ""
    return bos, eos


@lru_cache(maxsize=8)
def _formatter(template: str, bos: str, eos: str):
    """The template compiled once (a few ms each time otherwise), in the Jinja environment that llama-cpp-python
    and Transformers render chat templates in: sandboxed, trim_blocks, lstrip_blocks, loopcontrols, the
    `{% generation %}` tag passed through, tojson as Transformers writes it (not ASCII-escaped), strftime_now."""
    import json
    from datetime import datetime

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators=None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(f: str) -> str:
        return datetime.now().strftime(f)

    environment = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                                extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    compiled = environment.from_string(template)

    def render(messages: list, add_generation_prompt: bool, **extra: Any) -> str:
        def raise_exception(message: str):
            raise ValueError(message)

        return compiled.render(messages=messages, bos_token=bos, eos_token=eos, raise_exception=raise_exception,
                               add_generation_prompt=add_generation_prompt, strftime_now=strftime_now, **extra)

    return render
