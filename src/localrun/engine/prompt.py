"""The one prompt renderer: messages to the text a model reads.

With a chat template, the model's own (llama.cpp's built-in renderer where it knows the template, Jinja
otherwise, and Jinja always when tools are given); without one (a base model), either the messages' text
as it is (`raw`: `run`'s plain completion) or a plain transcript that a stop at the next "User:" ends
(chat and the server's chat endpoint).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import EngineError
from .llama import llama_cpp_module

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
    """The model's own chat template: llama.cpp's built-in renderer for the templates it recognises, Jinja
    for the rest and whenever tools, tool calls or tool results are in it (llama.cpp's renderer has none)."""
    template = engine.chat_template
    if template is None:
        raise EngineError("this model has no chat template: use --raw for plain completion")
    switch = think is not None and "enable_thinking" in template
    # A reasoning template often opens the thinking block at the end of the prompt, which llama.cpp's
    # built-in renderers (made for the template families they recognise) leave out: Jinja renders it.
    reasoning = "<think>" in template or "<|channel|>" in template
    if tools or switch or reasoning or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return _apply_jinja(engine, messages, add_generation_prompt, tools, {"enable_thinking": think} if switch else {})
    ll = llama_cpp_module()
    arr = (ll.llama_chat_message * len(messages))()
    keep = []  # the encoded strings must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), (m["content"] or "").encode("utf-8")
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    tmpl = template.encode("utf-8")
    size = sum(len(k) for k in keep) * 2 + 1024
    buf = ctypes.create_string_buffer(size)
    n = ll.llama_chat_apply_template(tmpl, arr, len(messages), add_generation_prompt, buf, size)
    if n > size:
        buf = ctypes.create_string_buffer(n)
        n = ll.llama_chat_apply_template(tmpl, arr, len(messages), add_generation_prompt, buf, n)
    if n >= 0:
        return buf.raw[:n].decode("utf-8")
    return _apply_jinja(engine, messages, add_generation_prompt, tools)


def _apply_jinja(engine, messages: Sequence[dict], add_generation_prompt: bool, tools, extra: Optional[dict] = None) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    info = engine.info
    bos = engine.detokenize([info.bos_token_id]) if info.bos_token_id is not None else ""
    eos = engine.detokenize([info.eos_token_id]) if info.eos_token_id is not None else ""
    fmt = Jinja2ChatFormatter(template=engine.chat_template, bos_token=bos, eos_token=eos,
                              add_generation_prompt=add_generation_prompt)
    return fmt(messages=list(messages), tools=tools, **(extra or {})).prompt
