"""The one request every dialect's translator makes (`Asked`), in localrun's own terms: the conversation or the
prompt, the tools, the sampling and load options, how thinking goes, what happens when the prompt does not fit,
and the reply the client wants (streamed or whole, how many, with usage). serve.prepare makes it the runtime
Request a model answers; no dialect's wire shape reaches past its translator.

A field's name here is what an error about it names (`errors.Refused.field`); each dialect's `Wording.name_of`
turns it into the name its clients wrote (Responses' max_output_tokens for max_tokens, Ollama's
options.num_predict). Load options are named `load.SETTING` (runtime.options.LoadSpec's fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass(frozen=True)
class Image:
    url: str  # a data: URL with the image's bytes (runtime.images.image_from_url reads it)
    name: str  # the field it came in, as the client wrote it (messages.0.content.1): what an error about it names


@dataclass(frozen=True)
class Call:
    """A tool call in an earlier turn of the conversation."""

    name: str
    arguments: Union[str, dict]  # as the client wrote them: JSON text, or an object
    id: Optional[str] = None


@dataclass
class Message:
    role: str  # system, user, assistant or tool
    text: str = ""
    images: list[Image] = field(default_factory=list)  # placed before the text
    calls: list[Call] = field(default_factory=list)  # an assistant's tool calls
    call_id: Optional[str] = None  # a tool's result: the call it answers
    name: Optional[str] = None  # a tool's result: the tool's name
    thinking: Optional[str] = None  # an assistant's earlier thinking, for the template to write back


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its function object as chat templates read it (name, description,
    parameters: a JSON schema, and whatever else the client gave, such as strict)."""

    spec: dict

    @property
    def name(self) -> str:
        return self.spec["name"]

    def for_template(self) -> dict:
        return {"type": "function", "function": self.spec}


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"  # auto (the model decides), none (no calls), required (a call must come), function (`name`'s)
    name: Optional[str] = None  # mode function: the tool that must be called
    allowed: Optional[tuple] = None  # only these may be called (OpenAI's allowed_tools), all staying in the prompt


@dataclass
class Reply:
    """What the client wants back, whatever its dialect writes it as."""

    stream: bool = False
    n: int = 1  # choices, each its own answer (a fixed seed counting up)
    usage: bool = False  # a stream ends with the usage (OpenAI's stream_options.include_usage)
    progress: bool = False  # a stream says how far its prompt is (llama-server's return_progress)
    load_only: bool = False  # no answer: the model loaded, or with keep_alive 0 unloaded (Ollama's empty request)


@dataclass
class Asked:
    """One request to a model, as every dialect's translator makes it."""

    model: Optional[str] = None  # None: the server's own
    keep_alive: Union[int, float, str, None] = None  # how long the model stays after this answer (None: the server's)
    load: dict[str, Any] = field(default_factory=dict)  # load options (LoadSpec's fields): another load reloads the model
    # What to answer: a conversation (through the chat template), or a prompt as it is (text or token ids)
    messages: Optional[list[Message]] = None
    prompt: Union[str, list[int], None] = None
    suffix: Optional[str] = None  # fill in the middle, between the prompt and this (the model's FIM tokens)
    context: Optional[list[int]] = None  # an earlier prompt and answer as tokens, before this one (Ollama's generate)
    tools: list[Tool] = field(default_factory=list)
    choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_calls: bool = True  # several calls may come in one answer
    # How to sample: SamplingOptions' fields the request sets (checked where options merge), and beside them
    sampling: dict[str, Any] = field(default_factory=dict)
    stops: list[str] = field(default_factory=list)  # added to the model's own
    logit_bias: Optional[dict[int, float]] = None  # added to the model's own
    json_schema: Optional[dict] = None  # the answer is JSON in this schema
    json_object: bool = False  # the answer is a JSON object
    max_tokens: Optional[int] = None
    ignore_eos: bool = False  # exactly max_tokens (llama-server's)
    draft_max: Optional[int] = None  # at most this many tokens drafted a step by prompt lookup (0: none)
    lora: Optional[list] = None  # llama-server's per-request LoRA scales, as given ([{"id", "scale"}]; None: the model's)
    top_logprobs: Optional[int] = None  # each token's logprob with this many alternatives (None: none)
    # Thinking: the template's switch, the effort it reads, more for the template, where the thinking goes
    think: Optional[bool] = None
    effort: Optional[str] = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning: str = "auto"  # auto: a reasoning model's thinking apart from the answer; none: left inline
    # When it does not fit, and what the model cannot do
    truncate: bool = False  # a prompt over the context is cut (its start), not refused (Ollama's)
    drop_oldest: bool = False  # a conversation over the context drops its oldest messages (Ollama's /api/chat)
    strict: bool = False  # tools or thinking asked of a model without them are refused, not passed over (Ollama's)
    plain_without_template: bool = False  # a model with no chat template gets the prompt as it is (Ollama's generate)
    reply: Reply = field(default_factory=Reply)
