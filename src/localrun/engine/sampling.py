"""Sampling options validated (SamplingOptions, made from the one list in options.py), the one way they are
merged, and the llama.cpp C sampler chain built from them."""

from __future__ import annotations

import ctypes
import math
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from ..errors import EngineError, Phrase, SettingError, UsageError
from .llama import llama_cpp_module
from .options import SAMPLING, Option


class _Rules(BaseModel):
    """What holds across options, whatever the list holds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _finite_bias(cls, bias: dict[int, float]) -> dict[int, float]:
        for tok, b in bias.items():
            if math.isnan(b) or b == math.inf:
                # +inf makes every probability NaN in the chain's softmax: llama.cpp then draws the last token.
                raise ValueError(f"the bias of token {tok} must be a number or -inf (a ban); to force a token, give it a large bias such as 100")
        return bias

    @field_validator("dry_sequence_breaker", check_fields=False)
    @classmethod
    def _no_empty_breaker(cls, breakers: list[str]) -> list[str]:
        if any(b == "" for b in breakers):
            raise ValueError("a DRY sequence breaker cannot be empty")
        return breakers

    @field_validator("stop", check_fields=False)
    @classmethod
    def _no_empty_stop(cls, stops: list[str]) -> list[str]:
        if any(s == "" for s in stops):
            raise ValueError("a stop sequence cannot be empty")
        return stops

    @field_validator("max_tokens", check_fields=False)
    @classmethod
    def _a_length(cls, n: int) -> int:
        if n == -2:  # llama.cpp's "until the context fills": what -1 does here (a full context ends any answer)
            return -1
        if n != -1 and n < 1:
            raise ValueError("use 1 or more (or -1 for no limit)")
        return n

    @model_validator(mode="after")
    def _one_constraint(self) -> "_Rules":
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give either a grammar or a JSON schema, not both")
        if self.min_tokens > 0 and (self.grammar is not None or self.json_schema is not None):
            # A complete grammar allows only end-of-text, which min_tokens bans: llama.cpp would abort.
            raise ValueError("min_tokens cannot combine with a grammar or JSON schema (the grammar decides where the text ends)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 and self.mirostat == 0




def _field(option: Option) -> tuple[Any, Any]:
    bounds = {k: getattr(option, k) for k in ("ge", "gt", "le") if getattr(option, k) is not None}
    if isinstance(option.default, (list, dict)):
        return option.type, Field(default_factory=lambda d=option.default: d.copy(), description=option.description, **bounds)
    return option.type, Field(option.default, description=option.description, **bounds)


SamplingOptions = create_model(
    "SamplingOptions", __base__=_Rules, __doc__="What `run`, `chat`, `serve` and `bench` accept (see options.SAMPLING).",
    **{option.name: _field(option) for option in SAMPLING},
)


class OptionError(SettingError):
    """A sampling value that does not validate. `field` names it (None: a rule across options), `value` is
    what was given and `reason` why it is refused; each edge words it (errors.SettingError)."""

    def __init__(self, field: Optional[str], value: Any, reason: str):
        self.field = field
        super().__init__(field, value, reason)

    def worded(self, name_of) -> str:
        if self.setting == "logit_bias":  # a map: its reason names the token
            return f"invalid {name_of(self.setting)}: {self.reason}"
        return super().worded(name_of)


_BOUNDS = {"greater_than_equal": "use {ge} or more", "greater_than": "use more than {gt}",
           "less_than_equal": "use at most {le}", "less_than": "use less than {lt}"}


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
        bound = _BOUNDS.get(first["type"])
        if bound is not None:  # "use 0 or more", not pydantic's "Input should be greater than or equal to 0"
            reason = bound.format(**first["ctx"])
        if first["type"] == "extra_forbidden":
            reason = f"unknown option (one of {', '.join(SamplingOptions.model_fields)})"
        raise OptionError(field, first.get("input"), reason) from None


def check_bias_tokens(bias: dict[int, float], n_vocab: int) -> None:
    """Logit-bias token ids must be this model's (SamplingOptions cannot know the vocabulary)."""
    for tok in bias:
        if not 0 <= tok < n_vocab:
            raise OptionError("logit_bias", tok, f"token {tok} is not this model's: its token ids run 0..{n_vocab - 1}")


class Sampler:
    """llama.cpp's C sampler chain for one generation. `sample` picks a token from the context's
    last logits entirely in C; Python only sees the chosen id."""

    def __init__(self, engine, options: SamplingOptions):
        self._ll = llama_cpp_module()
        self.options = options
        self._forced: list[int] = []  # force(): what comes next whatever the logits say
        self._penalties = []  # (sampler, tokens it looks back on): handles owned by the chains, fed the prompt too
        grammar = options.grammar
        self._from_schema = options.json_schema is not None
        if self._from_schema:
            grammar = json_schema_grammar(options.json_schema)
        # A grammar is a sampler of its own beside the chain, as llama.cpp's common sampler keeps it: the chain's
        # pick is checked against it alone, and only a pick it refuses has it applied to the whole vocabulary
        # (over Qwen's 151k tokens a forced tool call took 61 ms a token against 43 free on 2 CPU threads; now 42:
        # scripts/bench_tool_calls.py).
        self.grammar = self._grammar(engine, grammar) if grammar is not None else None
        if self.grammar is not None:  # the candidates it and the chain filter (every token and its logit), reused
            import numpy as np

            self._cand = np.empty(engine.n_vocab, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
            self._ids = np.arange(engine.n_vocab, dtype=np.int32)
            self._one = self._ll.llama_token_data()  # the chain's pick, checked alone
        self.chain = self._build(engine, options, ban_eog=False)
        # min_tokens: a second chain with end-of-generation banned, used until min_tokens is reached (never with a
        # grammar). Both see every accepted token, so penalty state stays in step.
        self.early = self._build(engine, options, ban_eog=True) if options.min_tokens > 0 else None
        self.prefilter = self._prefilter(engine, options, grammar)
        # Plain greedy (no bias, penalties, grammar): the chain is a stateless argmax, taken here with numpy over
        # the logits row instead: llama_sampler_sample first copies the whole vocabulary into candidates
        # (0.44 ms a token for gemma's 262k, 0.03 ms for numpy). The EOG ban of min_tokens is kept exactly.
        self._argmax = options.greedy and grammar is None and not self._penalties and not options.logit_bias
        self._engine = engine
        self._banned = frozenset(engine.eog_tokens()) if self._argmax and self.early is not None else frozenset()

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

    def _grammar(self, engine, grammar: str):
        g = self._ll.llama_sampler_init_grammar(engine.vocab, grammar.encode("utf-8"), b"root")
        if not g:
            if self._from_schema:  # the user wrote a schema, not this grammar: the converter is at fault
                raise EngineError(Phrase("llama.cpp refuses the grammar made from the JSON schema (a localrun bug): "
                                         "report the schema, or give a {grammar} instead"))
            raise UsageError("the grammar does not parse (GBNF): check it with llama.cpp's gbnf-validator")
        return g

    def _build(self, engine, o: SamplingOptions, ban_eog: bool):
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
            self._penalties.append((pen, last_n))
        if o.dry_multiplier > 0.0:
            breakers = [b.encode("utf-8") for b in o.dry_sequence_breaker]
            last_n = engine.n_ctx if o.dry_penalty_last_n == -1 else o.dry_penalty_last_n
            dry = ll.llama_sampler_init_dry(engine.vocab, o.dry_multiplier, o.dry_base, o.dry_allowed_length, last_n,
                                            (ctypes.c_char_p * len(breakers))(*breakers), len(breakers))
            add(dry)
            self._penalties.append((dry, last_n))
        seed = o.seed if o.seed is not None and o.seed >= 0 else 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
        if o.greedy:
            add(ll.llama_sampler_init_greedy())
        elif o.mirostat == 1:
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_mirostat(engine.n_vocab, seed, o.mirostat_tau, o.mirostat_eta, 100))
        elif o.mirostat == 2:
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_mirostat_v2(seed, o.mirostat_tau, o.mirostat_eta))
        else:
            # llama.cpp's default order: (penalties, DRY above) top-k, typical, top-p, min-p, XTC, temperature, draw.
            if o.top_k > 0:
                add(ll.llama_sampler_init_top_k(o.top_k))
            if o.typical_p < 1.0:
                add(ll.llama_sampler_init_typical(o.typical_p, 1))
            if o.top_p < 1.0:
                add(ll.llama_sampler_init_top_p(o.top_p, 1))
            if o.min_p > 0.0:
                add(ll.llama_sampler_init_min_p(o.min_p, 1))
            if o.xtc_probability > 0.0 and o.xtc_threshold <= 0.5:
                add(ll.llama_sampler_init_xtc(o.xtc_probability, o.xtc_threshold, 1, seed))
            add(ll.llama_sampler_init_temp(o.temperature))
            add(ll.llama_sampler_init_dist(seed))
        return chain

    def accept_prompt(self, tokens) -> None:
        """Let the repetition penalties and DRY see the prompt, as llama.cpp's server does (grammar does not)."""
        for pen, last_n in self._penalties:
            for t in tokens[-(last_n if last_n > 0 else len(tokens)) :]:
                self._ll.llama_sampler_accept(pen, t)

    def force(self, tokens) -> None:
        """These tokens come next, whatever the logits say (a thinking budget's end marker): each is taken as
        sampled (the grammar and the penalties see it)."""
        self._forced.extend(tokens)

    def sample(self, ctx, n_generated: int, idx: int = -1, prefiltered: bool = False) -> int:
        """Pick the next token from the logits of batch position `idx` (-1: the last one). `prefiltered`: its
        sequence carries the engine's backend top-k (Engine.prefilter_for), so the row holds candidates,
        not logits."""
        ll = self._ll
        if self._forced:
            tok = self._forced.pop(0)
            if self.grammar is not None and not self._allows(tok):
                self._forced.clear()  # a grammar that cannot write it (llama.cpp would abort on it): sampled as usual
            else:
                for s in (self.grammar, self.chain, self.early):
                    if s is not None:
                        ll.llama_sampler_accept(s, tok)
                return tok
        if self._argmax and not prefiltered:
            return self._greedy(self._engine.logits(idx), n_generated < self.options.min_tokens)
        if self.grammar is not None:
            return self._constrained(idx)
        if self.early is not None and n_generated < self.options.min_tokens:
            tok = ll.llama_sampler_sample(self.early, ctx, idx)
            ll.llama_sampler_accept(self.chain, tok)
            return tok
        tok = ll.llama_sampler_sample(self.chain, ctx, idx)
        if self.early is not None:
            ll.llama_sampler_accept(self.early, tok)
        return tok

    def _constrained(self, idx: int) -> int:
        """The chain's pick where the grammar allows it, else the chain's pick among what the grammar allows
        (llama.cpp's common_sampler_sample): the same token as the grammar applied first for greedy decoding;
        sampled, a token the grammar allows keeps its own chance. Both accept the token."""
        ll = self._ll
        row = self._engine.logits(idx)
        cur = self._candidates(row)
        ll.llama_sampler_apply(self.chain, ctypes.byref(cur))
        tok = cur.data[cur.selected].id
        one = self._one
        one.id, one.logit, one.p = tok, 0.0, 0.0
        ll.llama_sampler_apply(self.grammar, ctypes.byref(ll.llama_token_data_array(ctypes.pointer(one), 1, -1, False)))
        if one.logit == float("-inf"):  # refused: the grammar over the whole vocabulary, then the chain
            cur = self._candidates(row)
            ll.llama_sampler_apply(self.grammar, ctypes.byref(cur))
            ll.llama_sampler_apply(self.chain, ctypes.byref(cur))
            tok = cur.data[cur.selected].id
        ll.llama_sampler_accept(self.grammar, tok)
        ll.llama_sampler_accept(self.chain, tok)
        return tok

    def _allows(self, tok: int) -> bool:
        """Whether the grammar, where it stands, lets `tok` come next."""
        one = self._one
        one.id, one.logit, one.p = tok, 0.0, 0.0
        self._ll.llama_sampler_apply(self.grammar, ctypes.byref(self._ll.llama_token_data_array(ctypes.pointer(one), 1, -1, False)))
        return one.logit != float("-inf")

    def _candidates(self, row):
        """llama.cpp's candidates array over `row` (every token, its logit), in the buffer kept for it."""
        ll = self._ll
        cand = self._cand
        cand["id"], cand["logit"], cand["p"] = self._ids, row, 0.0
        data = ctypes.cast(cand.ctypes.data, ctypes.POINTER(ll.llama_token_data))
        return ll.llama_token_data_array(data, len(cand), -1, False)

    def _greedy(self, row, ban: bool) -> int:
        """The first highest logit (llama.cpp's greedy sampler picks the first of equals), end-of-generation
        tokens excluded while `ban` (min_tokens), as the chain's -inf bias excludes them."""
        import numpy as np

        tok = int(row.argmax())
        if ban and tok in self._banned:
            row = row.copy()
            row[list(self._banned)] = -np.inf
            tok = int(row.argmax())
        return tok

    def close(self) -> None:
        for name in ("chain", "early", "grammar"):
            handle = getattr(self, name, None)
            if handle:
                self._ll.llama_sampler_free(handle)
                setattr(self, name, None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def json_grammar() -> str:
    """A GBNF grammar for any JSON object (the API's response_format json_object)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The GBNF grammar for `schema`, by llama.cpp's converter's rules (json_schema.py); a schema it cannot
    express raises SchemaError, which names the keyword and where it is in the schema."""
    from .json_schema import json_schema_to_gbnf

    return json_schema_to_gbnf(schema)
