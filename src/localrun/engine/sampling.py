"""Sampling options (validated, bounded), the one way they are merged, and the llama.cpp C sampler chain built
from them.

SamplingOptions is the single list of options: the CLI's flags, the server's request fields and the chat's
/set are all made from its fields, so a new option is one field here (and its place in the chain below).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import UsageError
from .llama import llama_cpp_module


def _cli(*short: str, file: bool = False, pairs: bool = False, help: Optional[str] = None) -> dict:
    """How a field appears on the command line: short flags, a file to read (grammar, JSON schema), or
    TOKEN=VALUE pairs (logit bias); `help` is shorter than the description."""
    return {"cli": {"short": list(short), "file": file, "pairs": pairs, "help": help}}


class SamplingOptions(BaseModel):
    """What `run`, `chat`, `serve` and `bench` accept; defaults follow llama.cpp's own."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    temperature: float = Field(0.8, ge=0.0, le=5.0, description="0 means greedy (always the most likely token)",
                               json_schema_extra=_cli("-t", help="0 = greedy"))
    top_k: int = Field(40, ge=0, le=1_000_000, description="keep the k most likely tokens; 0 disables")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="nucleus sampling; 1.0 disables")
    min_p: float = Field(0.05, ge=0.0, le=1.0, description="drop tokens below min_p x the best probability; 0 disables")
    typical_p: float = Field(1.0, gt=0.0, le=1.0, description="locally typical sampling; 1.0 disables")
    repeat_penalty: float = Field(1.0, ge=0.0, le=10.0, description="penalise repeated tokens; 1.0 disables")
    repeat_last_n: int = Field(64, ge=-1, le=1_000_000, description="how many recent tokens the penalties see; -1 = context")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="penalise tokens already present; 0 disables")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="penalise tokens by their count so far; 0 disables")
    mirostat: int = Field(0, ge=0, le=2, description="0 off, 1 Mirostat, 2 Mirostat 2.0")
    mirostat_tau: float = Field(5.0, gt=0.0, le=20.0, description="Mirostat target entropy")
    mirostat_eta: float = Field(0.1, gt=0.0, le=1.0, description="Mirostat learning rate")
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 2, description="fixed seed: same seed, same output")
    max_tokens: int = Field(512, ge=-1, le=10_000_000, description="-1 = until the context is full",
                            json_schema_extra=_cli("-n"))
    min_tokens: int = Field(0, ge=0, le=10_000_000, description="end-of-generation is suppressed until this many",
                            json_schema_extra=_cli(help="suppress end-of-text until this many"))
    logit_bias: dict[int, float] = Field(default_factory=dict, description="token id -> added logit",
                                         json_schema_extra=_cli(pairs=True, help="TOKEN_ID=BIAS (repeatable)"))
    stop: list[str] = Field(default_factory=list, description="stop sequence (repeatable)", json_schema_extra=_cli("-s"))
    grammar: Optional[str] = Field(None, description="GBNF grammar text", json_schema_extra=_cli(file=True, help="GBNF grammar file"))
    json_schema: Optional[dict[str, Any]] = Field(None, description="constrain output to this JSON schema",
                                                  json_schema_extra=_cli(file=True, help="JSON schema file for the output"))

    @field_validator("logit_bias")
    @classmethod
    def _finite_bias(cls, bias: dict[int, float]) -> dict[int, float]:
        for tok, b in bias.items():
            if math.isnan(b) or b == math.inf:
                # +inf makes every probability NaN in the chain's softmax: llama.cpp then draws the last token.
                raise ValueError(f"the bias of token {tok} must be a number or -inf (a ban); to force a token, give it a large bias such as 100")
        return bias

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stops: list[str]) -> list[str]:
        if any(s == "" for s in stops):
            raise ValueError("a stop sequence cannot be empty")
        return stops

    @model_validator(mode="after")
    def _one_constraint(self) -> "SamplingOptions":
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give either a grammar or a JSON schema, not both")
        if self.min_tokens > 0 and (self.grammar is not None or self.json_schema is not None):
            # A complete grammar allows only end-of-text, which min_tokens bans: llama.cpp would abort.
            raise ValueError("min_tokens cannot combine with a grammar or JSON schema (the grammar decides where the text ends)")
        if self.max_tokens not in (-1,) and self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1 (or -1 for no limit)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 and self.mirostat == 0


class OptionError(UsageError):
    """A sampling value that does not validate. `field` names it (None: a rule across options), `value` is
    what was given and `reason` why it is refused; the message words it as the command line does."""

    def __init__(self, field: Optional[str], value: Any, reason: str):
        self.field, self.value, self.reason = field, value, reason
        if field is None:
            message = reason
        elif field == "logit_bias":
            message = f"invalid --logit-bias: {reason}"
        else:
            message = f"invalid --{field.replace('_', '-')} {value!r}: {reason}"
        super().__init__(message)


def merge_options(*layers: Optional[dict[str, Any]]) -> SamplingOptions:
    """The one merge of sampling options: llama.cpp's defaults (the fields' own), then each layer in turn
    (a model's `sampling:` in models.yaml, then what a request gives: flags, API fields, /set). A None value
    is 'not given'."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update({k: v for k, v in (layer or {}).items() if v is not None})
    try:
        return SamplingOptions.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        reason = first["msg"].removeprefix("Value error, ")  # pydantic's wording for a validator's ValueError
        if first["type"] == "extra_forbidden":
            reason = f"unknown option (one of {', '.join(SamplingOptions.model_fields)})"
        raise OptionError(field, first.get("input"), reason) from None


def cli_options() -> dict[str, dict]:
    """Each option as the command line shows it: name -> {short, file, pairs, help, annotation, default}."""
    out = {}
    for name, f in SamplingOptions.model_fields.items():
        spec = dict((f.json_schema_extra or {}).get("cli") or {"short": [], "file": False, "pairs": False, "help": None})
        spec["help"] = spec.get("help") or f.description
        spec["annotation"] = f.annotation
        out[name] = spec
    return out


def _is_list(name: str) -> bool:
    import typing

    return typing.get_origin(SamplingOptions.model_fields[name].annotation) is list


def cli_value(name: str, raw: Any) -> Any:
    """A flag's value as the option takes it: TOKEN=BIAS pairs parsed, a file read; None: not given."""
    if raw is None or (isinstance(raw, list) and not raw):
        return None
    spec = cli_options()[name]
    if spec["pairs"]:
        return parse_logit_bias(list(raw))
    if spec["file"]:
        return _FILE_READERS[name](Path(raw))
    return raw


def text_value(name: str, text: str) -> Any:
    """What `/set NAME TEXT` sets: lists split like a shell line, pairs and files as on the command line,
    none/null/off/- for 'none' (and 'random' for the seed)."""
    import shlex

    if name not in SamplingOptions.model_fields:
        raise OptionError(name, text, f"unknown parameter (one of {', '.join(SamplingOptions.model_fields)})")
    spec = cli_options()[name]
    empty = text.lower() in ("none", "null", "off", "-")
    if _is_list(name):
        return [] if empty else shlex.split(text)
    if spec["pairs"]:
        return {} if empty else parse_logit_bias(text.split())
    if spec["file"]:
        return None if empty else _FILE_READERS[name](Path(text).expanduser())
    if name == "seed" and (empty or text.lower() == "random"):
        return None
    return text


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """`TOKEN=BIAS` pairs; TOKEN is a token id. -inf bans a token (SamplingOptions refuses +inf and NaN)."""
    out: dict[int, float] = {}
    for item in items:
        tok, sep, bias = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(tok)] = float(bias)
        except ValueError:
            raise UsageError(f"invalid --logit-bias {item!r}: use TOKEN_ID=BIAS, e.g. 2=-100") from None
    return out


def check_bias_tokens(bias: dict[int, float], n_vocab: int) -> None:
    """--logit-bias token ids must be this model's (SamplingOptions cannot know the vocabulary)."""
    for tok in bias:
        if not 0 <= tok < n_vocab:
            raise UsageError(f"invalid --logit-bias token {tok}: this model's token ids run 0..{n_vocab - 1}")


def read_grammar(path: Optional[Path]) -> Optional[str]:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read --grammar {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--grammar {path} is not a UTF-8 text file: give a GBNF grammar") from None


def read_json_schema(path: Optional[Path]) -> Optional[dict[str, Any]]:
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --json-schema {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--json-schema {path} is not a UTF-8 text file: give a JSON schema") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--json-schema {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--json-schema {path} must hold a JSON object (a schema)")
    return data


_FILE_READERS = {"grammar": read_grammar, "json_schema": read_json_schema}


class Sampler:
    """llama.cpp's C sampler chain for one generation. `sample` picks a token from the context's
    last logits entirely in C; Python only sees the chosen id."""

    def __init__(self, engine, options: SamplingOptions):
        self._ll = llama_cpp_module()
        self.options = options
        self._penalties = []  # sampler handles owned by the chains, fed the prompt too
        grammar = options.grammar
        if options.json_schema is not None:
            grammar = json_schema_grammar(options.json_schema)
        self.chain = self._build(engine, options, grammar, ban_eog=False)
        # min_tokens: a second chain with end-of-generation banned, used until min_tokens is reached.
        # Both see every accepted token, so penalty and grammar state stay in step.
        self.early = self._build(engine, options, grammar, ban_eog=True) if options.min_tokens > 0 else None
        self.prefilter = self._prefilter(engine, options, grammar)

    def _prefilter(self, engine, o: SamplingOptions, grammar: Optional[str]) -> Optional[int]:
        """How many of the highest logits the chain needs to see to pick exactly the token it would pick
        from the whole vocabulary: the k of a top-k that may run before it, in llama.cpp's graph
        (Engine's backend sampling). None where the chain needs every logit.

        The chain's first cut is top-k (or greedy, a top-1). A bias that only lowers logits (a ban is -inf)
        can push each biased token below the cut, so each widens the prefilter by one; a positive bias can
        lift any token into the top k, and penalties, grammar and Mirostat look at the whole vocabulary.
        """
        if grammar is not None or o.mirostat or self._penalties or any(b > 0 for b in o.logit_bias.values()):
            return None
        keep = 1 if o.greedy else o.top_k
        if keep <= 0:
            return None
        lowered = set(o.logit_bias)
        if self.early is not None:
            lowered.update(engine.eog_tokens())
        return min(keep + len(lowered), engine.n_vocab)

    def _build(self, engine, o: SamplingOptions, grammar: Optional[str], ban_eog: bool):
        ll = self._ll
        check_bias_tokens(o.logit_bias, engine.n_vocab)  # before there is a chain to free
        params = ll.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = ll.llama_sampler_chain_init(params)
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731 - the chain owns each sampler
        bias = dict(o.logit_bias)
        if ban_eog:
            for tok in engine.eog_tokens():
                bias[tok] = float("-inf")
        if bias:
            arr = (ll.llama_logit_bias * len(bias))()
            for i, (tok, b) in enumerate(bias.items()):
                arr[i].token, arr[i].bias = tok, b
            add(ll.llama_sampler_init_logit_bias(engine.n_vocab, len(bias), arr))
        if o.repeat_penalty != 1.0 or o.presence_penalty != 0.0 or o.frequency_penalty != 0.0:
            last_n = engine.n_ctx if o.repeat_last_n == -1 else o.repeat_last_n
            pen = ll.llama_sampler_init_penalties(engine.n_vocab, last_n, o.repeat_penalty, o.frequency_penalty, o.presence_penalty)
            add(pen)
            self._penalties.append(pen)
        if grammar is not None:
            g = ll.llama_sampler_init_grammar(engine.vocab, grammar.encode("utf-8"), b"root")
            if not g:
                ll.llama_sampler_free(chain)
                raise UsageError("the grammar does not parse (GBNF): check it with llama.cpp's gbnf-validator")
            add(g)
        seed = o.seed if o.seed is not None else 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
        if o.greedy:
            add(ll.llama_sampler_init_greedy())
        elif o.mirostat == 1:
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_mirostat(engine.n_vocab, seed, o.mirostat_tau, o.mirostat_eta, 100))
        elif o.mirostat == 2:
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_mirostat_v2(seed, o.mirostat_tau, o.mirostat_eta))
        else:
            # llama.cpp's default order: top-k, typical, top-p, min-p, temperature, then draw.
            if o.top_k > 0:
                add(ll.llama_sampler_init_top_k(o.top_k))
            if o.typical_p < 1.0:
                add(ll.llama_sampler_init_typical(o.typical_p, 1))
            if o.top_p < 1.0:
                add(ll.llama_sampler_init_top_p(o.top_p, 1))
            if o.min_p > 0.0:
                add(ll.llama_sampler_init_min_p(o.min_p, 1))
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_dist(seed))
        return chain

    def accept_prompt(self, tokens) -> None:
        """Let the repetition penalties see the prompt, as llama.cpp's server does (grammar does not)."""
        for pen in self._penalties:
            for t in tokens[-(self.options.repeat_last_n if self.options.repeat_last_n > 0 else len(tokens)) :]:
                self._ll.llama_sampler_accept(pen, t)

    def sample(self, ctx, n_generated: int, idx: int = -1) -> int:
        """Pick the next token from the logits of batch position `idx` (-1: the last one)."""
        ll = self._ll
        if self.early is not None and n_generated < self.options.min_tokens:
            tok = ll.llama_sampler_sample(self.early, ctx, idx)
            ll.llama_sampler_accept(self.chain, tok)
            return tok
        tok = ll.llama_sampler_sample(self.chain, ctx, idx)
        if self.early is not None:
            ll.llama_sampler_accept(self.early, tok)
        return tok

    def close(self) -> None:
        for name in ("chain", "early"):
            handle = getattr(self, name, None)
            if handle:
                self._ll.llama_sampler_free(handle)
                setattr(self, name, None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def json_schema_grammar(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises assorted errors on schemas it cannot express
        raise UsageError(f"cannot turn the JSON schema into a grammar: {exc}") from None
