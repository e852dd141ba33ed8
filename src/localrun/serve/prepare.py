"""A request (serve.asked.Asked) made the runtime Request a model answers (runtime.generate), checked against what
the model can do, which serve sees through runtime.facts.ModelFacts: its vocabulary, its template's tools and
thinking, its fill-in-the-middle tokens, its default sampling; and how the answer's tool calls are read (ToolMode).
What cannot be answered is refused naming the field in localrun's names (serve.errors)."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from ..runtime import (AnswerStream, OptionError, Request, SamplingOptions, SchemaError, call_schema, check_bias_tokens,
                       forced_grammar, json_schema_grammar, merge_options, parser_for)
from ..runtime.facts import ModelFacts
from ..runtime.images import image_from_url
from ..runtime.options import json_grammar
from ..runtime.request import REASONING_EFFORTS
from .asked import Asked, Message
from .errors import Refused

MAX_LENGTH = 10_000_000  # the longest answer an option may ask for (options.SAMPLING's bound)


def prepared(asked: Asked, facts: ModelFacts) -> tuple[Request, Optional["ToolMode"]]:
    """The runtime request `asked` is of this model, and how its tools are read in the answer (None: no tools).
    The prompt itself is made on the request path."""
    if asked.strict and asked.think and not facts.thinks:  # as Ollama answers for a model that does not think
        raise Refused(f'"{asked.model}" does not support thinking')
    asked = _plain_if_no_template(_defaulted(asked, facts), facts)
    request, tooling = _request(asked, facts)
    request.drop_oldest = asked.messages is not None and asked.drop_oldest
    request.truncate = asked.truncate
    if asked.messages is not None and asked.context:
        bad = [t for t in asked.context if not 0 <= t < facts.n_vocab]
        if bad:
            raise Refused(f"context holds token id {bad[0]}, out of this model's range 0..{facts.n_vocab - 1}: send the"
                          " context an answer of this model gave", "context")
        request.context = list(asked.context)
    request.sampling = _sampling(asked, facts.sampling, tooling)
    forced = tooling is not None and (tooling.forced is not None or tooling.grammar is not None)
    _check_sampler(facts, request.sampling, "tool_choice" if forced else "response_format")
    request.top_logprobs, request.draft_max = asked.top_logprobs, asked.draft_max
    if asked.lora is not None:
        request.lora = facts.lora_scales(asked.lora)  # LoraRequestError (a SettingError of "lora"): a 400 naming it
    return request, tooling


def prompt_length(asked: Asked, facts: ModelFacts) -> int:
    """How many tokens `asked`'s prompt is for this model, whether it fits a slot or not."""
    request, _ = _request(_defaulted(asked, facts), facts)
    return facts.prompt_length(request)


def rendered(asked: Asked, facts: ModelFacts, add_generation_prompt: bool = True) -> str:
    """The text `asked`'s conversation is for this model, its template rendered as the request would be answered
    (llama-server's /apply-template; `add_generation_prompt` false: without the assistant's turn opened)."""
    request, _ = _request(_plain_if_no_template(_defaulted(asked, facts), facts), facts)
    return facts.rendered(request, add_generation_prompt)


def _defaulted(asked: Asked, facts: ModelFacts) -> Asked:
    """`asked` with what the server gives a request that does not say otherwise (serve --reasoning,
    --reasoning-effort, --chat-template-kwargs: llama-server's); the request's own settings win, key by key."""
    given = facts.template_defaults
    if given.think is None and given.effort is None and not given.kwargs:
        return asked
    return replace(asked, think=given.think if asked.think is None else asked.think,
                   effort=given.effort if asked.effort is None else asked.effort,
                   template_kwargs={**given.kwargs, **asked.template_kwargs})


def _plain_if_no_template(asked: Asked, facts: ModelFacts) -> Asked:
    """Ollama's generate for a model with no chat template (a base model): the prompt as it is, as Ollama's default
    template ({{ .Prompt }}) gives it, a system prompt before it. With images it stays a conversation: the request
    path gives it as plain text too, each image before its message's text."""
    if not asked.plain_without_template or facts.chat_template is not None or asked.messages is None:
        return asked
    if any(m.images for m in asked.messages):
        return asked
    text = "\n\n".join(m.text for m in asked.messages if m.text)
    return replace(asked, messages=None, prompt=text, think=None, effort=None, template_kwargs={}, reasoning="auto")


def _request(asked: Asked, facts: ModelFacts) -> tuple[Request, Optional["ToolMode"]]:
    """The request `asked` is (a conversation with its tools and thinking switch; or a prompt), and how its tools
    are served."""
    if asked.messages is None:
        return _prompt_request(asked, facts), None
    tooling = tool_mode(asked, facts)
    kwargs, think, effort = dict(asked.template_kwargs), asked.think, asked.effort
    if effort is not None:  # the template reads it (gpt-oss's reasoning_effort); "none": no thinking, as llama.cpp takes it
        if effort not in REASONING_EFFORTS:
            raise Refused(f"invalid reasoning_effort {effort!r}: one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
        kwargs.setdefault("reasoning_effort", effort)
        if effort == "none" and think is None:
            think = False
    request = Request(messages=[message_for_template(m) for m in asked.messages],
                      tools=[t.for_template() for t in asked.tools] if tooling else None,
                      think=think, reasoning=asked.reasoning, template_kwargs=kwargs)
    return request, tooling


def _prompt_request(asked: Asked, facts: ModelFacts) -> Request:
    prompt = asked.prompt
    if asked.suffix:  # fill in the middle: what goes between the prompt and the suffix (code completion in editors)
        if not isinstance(prompt, str):
            raise Refused("suffix needs the prompt as text (the code before the cursor)", "suffix")
        tokens = facts.infill_tokens(prompt, asked.suffix)
        if tokens is None:
            raise Refused(f"{facts.file_name} has no fill-in-the-middle tokens, so it cannot fill in between a prompt and a"
                          " suffix: use a code model that has them (Qwen2.5-Coder, CodeLlama, StarCoder, ...)", "suffix")
        return Request(tokens=tokens)
    if not prompt:
        raise Refused("prompt is empty: give it some text or token ids", "prompt")
    if isinstance(prompt, list):
        bad = [t for t in prompt if not 0 <= t < facts.n_vocab]
        if bad:
            raise Refused(f"token id {bad[0]} is out of range: this model's ids run 0..{facts.n_vocab - 1}", "prompt")
        return Request(tokens=list(prompt))
    return Request(messages=[{"role": "user", "content": prompt}], raw=True)


def message_for_template(m: Message) -> dict[str, Any]:
    """A message as the prompt renderer takes it (engine.prompt shapes it for the template): a tool call's arguments
    as the client wrote them (checked to be a JSON object), a tool result with the id and name of the call it
    answers, an assistant's earlier thinking (reasoning_content, llama.cpp's name) for the template to write back
    where its model was trained to read it, and its images (decoded from their data: URLs, named as the client
    wrote them), which the prompt puts before its text."""
    out: dict[str, Any] = {"role": m.role, "content": m.text}
    if m.calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _checked(c.arguments)}}
                             for c in m.calls]
    if m.role == "assistant" and m.thinking:
        out["reasoning_content"] = m.thinking
    if m.role == "tool":
        out["tool_call_id"] = m.call_id
        if m.name is not None:
            out["name"] = m.name
    if m.images:
        out["images"] = [image_from_url(image.url, image.name) for image in m.images]
    return out


def _checked(given: Union[str, dict]) -> Union[str, dict]:
    """A tool call's arguments as given, once known to be a JSON object (a string's text kept: templates that
    write arguments as text then write the client's own, and the prompt stays as it was)."""
    if isinstance(given, dict):
        return given
    try:
        value = json.loads(given or "{}")
    except ValueError:
        raise Refused(f"a tool call's arguments are not JSON: {given[:80]!r}", "messages") from None
    if not isinstance(value, dict):
        raise Refused("a tool call's arguments must be a JSON object", "messages")
    return given or "{}"


# -- sampling ---------------------------------------------------------------------------------------


def _sampling(asked: Asked, base: SamplingOptions, tooling: Optional["ToolMode"]) -> SamplingOptions:
    """The model's options (the catalogue's and serve's flags), then the request's own: its stops and logit biases
    add to the model's; a forced call's grammar, the length, ignore_eos."""
    update: dict[str, Any] = dict(asked.sampling)
    seed = update.get("seed")
    if isinstance(seed, int) and not -1 <= seed < 2**32 - 1 and -2**63 <= seed < 2**63:
        update["seed"] = seed % (2**32 - 1)  # OpenAI's seeds are 64-bit, llama.cpp's 32 (its last value, random)
    if any(s == "" for s in asked.stops):
        raise Refused("a stop sequence cannot be empty", "stop")
    update["stop"] = list(dict.fromkeys([*base.stop, *asked.stops]))
    if asked.logit_bias is not None:
        update["logit_bias"] = {**base.logit_bias, **asked.logit_bias}
    if asked.json_schema is not None:
        update["json_schema"] = asked.json_schema
    elif asked.json_object:
        update["grammar"] = json_grammar()
    options = merge_options(base.model_dump(), update)  # OptionError: the field named by the dialect (serve.errors)
    if tooling is not None and (tooling.forced is not None or tooling.grammar is not None):
        if options.grammar is not None:
            raise Refused("tool_choice required (or a named function) cannot combine with a grammar", "tool_choice")
        # A forced call writes no text for a response format to shape: the call's own grammar decodes it, as OpenAI
        # takes the pair (instructor's RESPONSES_TOOLS mode sends both).
        forced = {"json_schema": tooling.forced} if tooling.forced is not None else {"grammar": tooling.grammar, "json_schema": None}
        options = options.model_copy(update={**forced, "stop": []})  # the grammar ends the call whole
    return _length(options, asked, base)


def _length(options: SamplingOptions, asked: Asked, base: SamplingOptions) -> SamplingOptions:
    if asked.max_tokens is not None:
        options = options.model_copy(update={"max_tokens": asked.max_tokens})
    elif options.max_tokens <= 0 or "max_tokens" not in base.model_fields_set:
        # Unasked and unset (no `serve -n`, catalogue or Modelfile length): until the slot is full, as OpenAI's,
        # Ollama's and llama-server's are; the command line's 512 was cutting agents' answers (Codex sends none).
        options = options.model_copy(update={"max_tokens": -1})
    if asked.ignore_eos:
        if options.grammar is not None or options.json_schema is not None:
            raise Refused("ignore_eos cannot combine with response_format (the grammar decides where the text ends)", "ignore_eos")
        options = options.model_copy(update={"min_tokens": options.max_tokens if options.max_tokens > 0 else MAX_LENGTH})
    return options


def _check_sampler(facts: ModelFacts, options: SamplingOptions, schema_from: str) -> None:
    """What the sampler chain would refuse, named as the request's field before the request is queued: token ids
    outside this model's vocabulary, a JSON schema the grammar converter cannot express."""
    try:
        check_bias_tokens(options.logit_bias, facts.n_vocab)
    except OptionError as exc:
        raise Refused(f"invalid logit_bias: {exc.reason}", "logit_bias") from None
    if options.json_schema is not None:
        try:
            json_schema_grammar(options.json_schema)
        except SchemaError as exc:
            raise Refused(f"the JSON schema cannot be followed: {exc}", schema_from) from None


# -- tools ------------------------------------------------------------------------------------------


@dataclass
class ToolMode:
    """A chat request with tools the model may call: the reader of the model's family (runtime.parser_for, with
    the tools offered), the names of the tools, how a forced call is generated (tool_choice required or a named
    function: a grammar in the family's own format, or else the generic JSON call's schema), whether several
    calls may come back, and the ids the template demands (Mistral's: 9 letters and digits)."""

    parser: Any
    names: frozenset = frozenset()
    forced: Optional[dict] = None
    grammar: Optional[str] = None
    parallel: bool = True
    nine_char_ids: bool = False

    def calls_in(self, text: str) -> tuple[str, list[dict]]:
        """(content, calls) of a whole answer."""
        message = self.parser.read(text)
        return self.kept(message.content, [self.call(c) for c in message.calls])

    def call(self, call) -> dict:
        """A call read from the answer (formats.ToolCall) as the dialects take it: {"id", "name", "arguments":
        object, "raw": the arguments' JSON text as written}."""
        arguments = json.loads(call.arguments or "{}")
        return {"id": call.id if call.id and not self.nine_char_ids else self.new_id(), "name": call.name,
                "arguments": arguments, "raw": call.arguments or "{}"}

    def new_id(self) -> str:
        if self.nine_char_ids:
            return uuid.uuid4().hex[:9]
        return "call_" + uuid.uuid4().hex[:24]

    def kept(self, content: str, calls: list[dict]) -> tuple[str, list[dict]]:
        # A forced call cut short (max_tokens) before one was whole is no answer: its JSON was the grammar's
        # form of a call, not text for the client (it came back as content; found by a helper).
        if (self.forced is not None or self.grammar is not None) and not calls:
            return "", []
        return content, (calls if self.parallel else calls[:1])

    def stream(self):
        """The answer read as it streams (runtime.AnswerStream): its deltas."""
        return AnswerStream(self.parser)


_warned_templates: set = set()


def tool_mode(asked: Asked, facts: ModelFacts) -> Optional[ToolMode]:
    """How a chat request's tools are served, or None when there are none to offer (none given, or tool_choice
    none; or a template without tools, tool_choice auto). Refused when a call is required of a template that cannot
    render tools."""
    choice = asked.choice
    if not asked.tools:
        if choice.mode not in ("none", "auto") or choice.allowed is not None:
            raise Refused("tool_choice needs tools", "tool_choice")
        return None
    if choice.mode == "none":
        return None
    offered, mode = _offered(asked)
    if not facts.calls_tools:
        return _without_tools(asked, facts, mode)
    names = [t.name for t in offered]
    tools = [t.for_template() for t in offered]
    named = choice.name if mode == "function" else None
    parser = parser_for(facts.chat_template, tools=[t.for_template() for t in asked.tools], parallel=asked.parallel_calls,
                        reasoning=asked.reasoning, forced=mode != "auto")
    parser.tools = parser.tools.only(names)
    tooling = ToolMode(parser, frozenset(names), parallel=asked.parallel_calls, nine_char_ids="length != 9" in facts.chat_template)
    if mode != "auto":
        # Forced: one call (a named function, or parallel_tool_calls false), else one or more; in the family's own
        # format where it has one (what the model was trained to write), else as the generic JSON call.
        several = asked.parallel_calls and named is None
        thinking = asked.think is not False and asked.effort != "none"
        tooling.grammar = forced_grammar(parser.family, tools, named, several, think=thinking)
        if tooling.grammar is None:
            tooling.forced = call_schema(tools, named, parallel=several)
    return tooling


def _offered(asked: Asked) -> tuple[list, str]:
    """(the tools that may be called, how: auto, required or function) of a request's tool_choice."""
    choice, names = asked.choice, [t.name for t in asked.tools]
    if choice.allowed is not None:  # OpenAI's allowed_tools: every tool stays in the prompt (its cache with it)
        if choice.mode not in ("auto", "required") or not choice.allowed:
            raise Refused("tool_choice allowed_tools needs {'mode': 'auto' or 'required', 'tools': [{'type': 'function',"
                          " 'function': {'name': ...}}, ...]}", "tool_choice")
        if not set(choice.allowed) <= set(names):
            raise Refused(f"tool_choice allowed_tools names a tool not given: use some of {', '.join(names)}", "tool_choice")
        return [t for t in asked.tools if t.name in choice.allowed], choice.mode
    if choice.mode == "function" and choice.name not in names:
        raise Refused(f"tool_choice names no given tool: use one of {', '.join(names)}", "tool_choice")
    return list(asked.tools), choice.mode


def _without_tools(asked: Asked, facts: ModelFacts, mode: str) -> None:
    """A template that cannot render tools: a 400 where the dialect refuses them (Ollama's "does not support tools")
    or a call is required; else the request is answered as text, as llama-server answers it (said once)."""
    if asked.strict:
        raise Refused(f"{asked.model or facts.file_name} does not support tools (its chat template has none): leave"
                      " tools out, or use a model that has them (/api/show lists \"tools\" in its capabilities)", "tools")
    if mode != "auto":
        raise Refused(f"{facts.file_name}'s chat template cannot render tools, so a tool call cannot be required of it"
                      " (use tool_choice auto, or a model whose template has tools)", "tool_choice")
    if (facts.path, facts.chat_template) not in _warned_templates:
        _warned_templates.add((facts.path, facts.chat_template))
        print(f"notice: {facts.file_name}'s chat template has no tool support: requests with tools are answered as text",
              file=sys.stderr, flush=True)
    return None
