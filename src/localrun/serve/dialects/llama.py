"""llama-server's own dialect (llama.cpp's tools/server), so that tools written for it find its endpoints here:
/completion (and /completions) and /infill with their field names (`prompt`, `n_predict`, `input_prefix`,
`input_suffix`, `input_extra`; an answer's `content`, `tokens_predicted`, `stop_type`, `timings`...), /tokenize
(`with_pieces`), /detokenize, /props and /lora-adapters; its error shape ({"error": {"code", "message", "type"}}).

As llama-server does, a body's fields that mean nothing here (`cache_prompt`, `id_slot`, `samplers`, `n_keep`,
`t_max_predict_ms`, ...) are passed over; those taken are checked, a bad one a 400 naming it. Pure: a body in,
localrun's request (serve.asked.Asked) out; the answer's events in, llama-server's JSON or server-sent events out.
What needs the model's tokenizer (a prompt of text and token ids, a logit bias by text, the infill prompt) takes
its facts (runtime.facts.ModelFacts). serve/routes/llama.py serves it."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from ..asked import Asked, Reply
from ..checks import need, sampling_of, settings, stops_of, top_logprobs
from ..errors import ContextOverflow, Fault, TooLong, Wording, fault
from ..stream import Event

# localrun's names of the fields as llama-server's clients write them
_NAMES = {"max_tokens": "n_predict", "dry_sequence_breaker": "dry_sequence_breakers", "top_logprobs": "n_probs"}
WORDING = Wording(more_context="restart the server with a larger --ctx", no_projector="start the server with --mmproj FILE for it",
                  name_of=lambda field: _NAMES.get(field, field))

# llama-server's error types by status (format_error_response)
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          501: "not_supported_error", 503: "unavailable_error"}


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    """llama-server's error shape: {"error": {"code": STATUS, "message", "type"}}; a prompt over the context is its
    exceed_context_size_error with n_prompt_tokens and n_ctx."""
    f = fault(exc, WORDING)
    status, body = error_shape(f)
    cause = exc.cause if isinstance(exc, TooLong) else exc if isinstance(exc, ContextOverflow) else None
    if cause is not None:
        body["error"].update(type="exceed_context_size_error", n_prompt_tokens=cause.n_prompt, n_ctx=cause.n_ctx)
    return status, body


def error_shape(f: Fault) -> tuple[int, dict]:
    kind = _TYPES.get(f.status, "server_error" if f.status >= 500 else "invalid_request_error")
    return f.status, {"error": {"code": f.status, "message": f.message, "type": kind}}


# -- requests --------------------------------------------------------------------------------------

# llama-server's names for localrun's settings, where they differ
_RENAMED = {"dry_sequence_breakers": "dry_sequence_breaker", "n_predict": "max_tokens"}
_TAKEN = {"temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
          "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
          "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "seed",
          "grammar", "json_schema", "n_predict", "max_tokens", "stop", "min_tokens"}

Prompt = Union[str, list]  # text, or token ids and text mixed (llama-server's tokenize_mixed)


@dataclass
class Native:
    """What a /completion or /infill body asks beyond Asked: its prompts (several: an answer each, as a list), the
    logit bias as written (token ids or text: made tokens with the model's tokenizer), the tokens in the answer
    (return_tokens), the fields kept (response_fields), the alternatives per token (n_probs), as the model gives them
or after the sampler chain (post_sampling_probs), the least indentation of the answer's lines (n_indent)."""

    prompts: list[Prompt] = field(default_factory=list)
    logit_bias: Any = None
    return_tokens: bool = False
    response_fields: list[str] = field(default_factory=list)
    n_probs: int = 0
    post_sampling: bool = False
    n_indent: int = 0


def completion_asked(data: Any) -> tuple[Asked, Native]:
    """The request a /completion body asks for, and what it asks beyond it."""
    need(isinstance(data, dict), "the body must be a JSON object")
    need("prompt" in data, '"prompt" must be provided', "prompt")
    asked, native = _common(data)
    native.prompts = _prompts(data["prompt"])
    need(len(native.prompts) == 1 or not asked.reply.stream, "several prompts are answered whole: leave stream out", "stream")
    return asked, native


@dataclass
class Infill:
    """A /infill body's parts: the code before and after the cursor, other files for context, the text typed."""

    prefix: str
    suffix: str
    extra: list[tuple[str, str]]  # (file name, text)
    prompt: str = ""


def infill_asked(data: Any) -> tuple[Asked, Native, Infill]:
    """The request a /infill body asks for (llama.vim's, llama.vscode's), checked as llama-server checks it."""
    need(isinstance(data, dict), "the body must be a JSON object")
    for name in ("input_prefix", "input_suffix"):
        need(name in data, f'"{name}" is required', name)
        need(isinstance(data[name], str), f'"{name}" must be a string', name)
    need(isinstance(data.get("prompt", ""), str), '"prompt" must be a string', "prompt")
    extra = [] if data.get("input_extra") is None else data["input_extra"]
    need(isinstance(extra, list), '"input_extra" must be an array of {"filename": string, "text": string}', "input_extra")
    chunks = []
    for i, chunk in enumerate(extra):
        need(isinstance(chunk, dict) and isinstance(chunk.get("text"), str),
             f'input_extra.{i} must contain a "text" field with a string value', "input_extra")
        need(isinstance(chunk.get("filename", ""), str), f'input_extra.{i}\'s "filename" must be a string', "input_extra")
        chunks.append((chunk.get("filename", "tmp"), chunk["text"]))
    asked, native = _common(data)
    return asked, native, Infill(data["input_prefix"], data["input_suffix"], chunks, data.get("prompt", ""))


def _common(data: dict) -> tuple[Asked, Native]:
    """What /completion and /infill share: the model, sampling, length, stops, logprobs, LoRA scales, the reply."""
    given = {_RENAMED.get(name, name): data[name] for name in _TAKEN if data.get(name) is not None}
    length = given.get("max_tokens")
    if isinstance(length, int) and not isinstance(length, bool) and length <= 0:
        del given["max_tokens"]  # -1: until the context is full (llama-server's default)
    values = settings({"model": data.get("model"), **given})
    flags = {name: data.get(name, False) for name in ("stream", "return_tokens", "ignore_eos", "return_progress",
                                                      "post_sampling_probs")}
    for name, value in flags.items():
        need(isinstance(value, bool), f"{name} must be true or false", name)
    n_probs = data.get("n_probs", 0)
    need(isinstance(n_probs, int) and not isinstance(n_probs, bool) and n_probs >= 0, "n_probs must be 0 or more", "n_probs")
    n_indent = data.get("n_indent", 0)
    need(isinstance(n_indent, int) and not isinstance(n_indent, bool), "n_indent must be a whole number", "n_indent")
    fields = data.get("response_fields") or []
    need(isinstance(fields, list) and all(isinstance(f, str) for f in fields), "response_fields must be a list of names",
         "response_fields")
    asked = Asked(model=values.get("model"), sampling=sampling_of(values), stops=stops_of(values.get("stop")),
                  max_tokens=values.get("max_tokens"), ignore_eos=flags["ignore_eos"], lora=data.get("lora"),
                  top_logprobs=top_logprobs(n_probs, "n_probs") if n_probs else None,
                  reply=Reply(stream=flags["stream"], progress=flags["return_progress"]))
    return asked, Native(logit_bias=data.get("logit_bias"), return_tokens=flags["return_tokens"], response_fields=fields,
                         n_probs=n_probs, post_sampling=flags["post_sampling_probs"] and n_probs > 0, n_indent=max(0, n_indent))


def _prompts(given: Any) -> list[Prompt]:
    """A body's prompts as llama-server reads them: text; token ids (text mixed in); a list of those (an answer
    each); {"prompt_string": ...} (a multimodal prompt without its media)."""
    if isinstance(given, dict):
        need(not given.get("multimodal_data"), "this model takes no images or audio in a prompt", "prompt")
        need(isinstance(given.get("prompt_string"), str), 'a prompt object needs "prompt_string"', "prompt")
        return [given["prompt_string"]]
    if isinstance(given, str):
        return [given]
    need(isinstance(given, list) and given, '"prompt" must be text, token ids, or a list of them', "prompt")
    if all(_is_piece(p) for p in given):
        return [given]  # one prompt of token ids and text
    out = []
    for p in given:
        if isinstance(p, list) and p and all(_is_piece(x) for x in p):
            out.append(p)
        else:
            out += _prompts(p)
    return out


def _is_piece(p: Any) -> bool:
    return isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool))


def prompt_tokens(prompt: Prompt, facts) -> list[int]:
    """A prompt as the model's tokens, as llama-server makes them (tokenize_mixed): text read with special markers,
    BOS before it where the model adds one (before the first piece only, and only when it is text)."""
    if isinstance(prompt, str):
        return facts.tokens_of(prompt, add_special=True)
    out: list[int] = []
    for i, piece in enumerate(prompt):
        out += facts.tokens_of(piece, add_special=i == 0) if isinstance(piece, str) else [piece]
    bad = [t for t in out if not 0 <= t < facts.n_vocab]
    need(not bad, f"token id {bad[0] if bad else 0} is out of range: this model's ids run 0..{facts.n_vocab - 1}", "prompt")
    return out


def logit_bias_of(given: Any, facts) -> Optional[dict[int, float]]:
    """llama-server's logit_bias: [[token or text, bias], ...] or {"token or text": bias}; a bias of false bans the
    token; text is each of its tokens. Entries it cannot read are passed over, as llama-server does."""
    if given is None:
        return None
    pairs = given.items() if isinstance(given, dict) else [p for p in given if isinstance(p, list) and len(p) == 2] \
        if isinstance(given, list) else None
    need(pairs is not None, "logit_bias must be a list of [token, bias] pairs or an object", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in pairs:
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            continue
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        tokens = [key] if isinstance(key, int) and not isinstance(key, bool) else facts.tokens_of(key, parse_special=False) \
            if isinstance(key, str) else []
        out.update({t: float(bias) for t in tokens if 0 <= t < facts.n_vocab})
    return out


def lora_entries(data: Any) -> list:
    """POST /lora-adapters' body: a list of {"id", "scale"} (runtime.lora checks each)."""
    need(isinstance(data, list), "Request body must be an array", "lora")
    return data


def tokenize_answer(data: Any, facts) -> dict:
    """/tokenize: {"content", "add_special", "parse_special", "with_pieces"} -> {"tokens": ids, or {id, piece}s}; a
    piece that is not whole UTF-8 is its bytes."""
    need(isinstance(data, dict), "the body must be a JSON object")
    if "content" not in data:
        return {"tokens": []}
    flags = {name: data.get(name, default) for name, default in (("add_special", False), ("parse_special", True), ("with_pieces", False))}
    for name, value in flags.items():
        need(isinstance(value, bool), f"{name} must be true or false", name)
    content = data["content"]
    need(isinstance(content, (str, list)), "content must be text, or token ids and text", "content")
    if isinstance(content, list):
        need(all(_is_piece(p) for p in content), "content must be text, or token ids and text", "content")
    tokens = (facts.tokens_of(content, flags["add_special"], flags["parse_special"]) if isinstance(content, str)
              else prompt_tokens(content, facts) if flags["add_special"] else _mixed(content, facts, flags["parse_special"]))
    if not flags["with_pieces"]:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": _piece(facts.piece(t))} for t in tokens]}


def _mixed(content: list, facts, parse_special: bool) -> list[int]:
    return [t for p in content for t in (facts.tokens_of(p, False, parse_special) if isinstance(p, str) else [p])]


def _piece(raw: bytes) -> Union[str, list[int]]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def detokenize_answer(data: Any, facts) -> dict:
    """/detokenize: {"tokens"} -> {"content"}."""
    need(isinstance(data, dict), "the body must be a JSON object")
    tokens = data.get("tokens", [])
    need(isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens),
         "tokens must be a list of token ids", "tokens")
    bad = [t for t in tokens if not 0 <= t < facts.n_vocab]
    need(not bad, f"token id {bad[0] if bad else 0} is out of range: this model's ids run 0..{facts.n_vocab - 1}", "tokens")
    return {"content": facts.detokenize(tokens)}


# -- answers -----------------------------------------------------------------------------------------


def generation_settings(sampling, *, stream: bool, lora: Optional[tuple], n_predict: Optional[int] = None) -> dict:
    """The sampling an answer was made with, as llama-server's generation_settings names it (a banned token's bias,
    minus infinity, as its JSON writes it: null)."""
    s = sampling
    length = n_predict if n_predict is not None else (s.max_tokens if s.max_tokens > 0 else -1)
    biases = [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in (s.logit_bias or {}).items()]
    return {"seed": -1 if s.seed is None else s.seed, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "xtc_probability": s.xtc_probability, "xtc_threshold": s.xtc_threshold,
            "typical_p": s.typical_p, "repeat_last_n": s.repeat_last_n, "repeat_penalty": s.repeat_penalty,
            "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
            "dry_multiplier": s.dry_multiplier, "dry_base": s.dry_base, "dry_allowed_length": s.dry_allowed_length,
            "dry_penalty_last_n": s.dry_penalty_last_n, "dry_sequence_breakers": list(s.dry_sequence_breaker),
            "mirostat": s.mirostat, "mirostat_tau": s.mirostat_tau, "mirostat_eta": s.mirostat_eta, "stop": list(s.stop),
            "max_tokens": length, "n_predict": length, "stream": stream, "logit_bias": biases,
            "grammar": s.grammar or "", "lora": [{"id": i, "scale": x} for i, x in enumerate(lora or ())]}


def timings(stats) -> dict:
    """An answer's timings as llama-server gives them."""
    prompt_n, predicted_n = stats.prompt_tokens - stats.cached_tokens, stats.generated_tokens
    prompt_ms, predicted_ms = stats.prompt_eval_s * 1000, stats.eval_s * 1000
    return {"cache_n": stats.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / stats.prompt_eval_s if stats.prompt_eval_s > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / stats.eval_tokens if stats.eval_tokens else 0.0,
            "predicted_per_second": stats.eval_tokens / stats.eval_s if stats.eval_s > 0 else 0.0}


_STOP_TYPES = {"eos": "eos", "stop": "word", "length": "limit"}


@dataclass
class Made:
    """What an answer's last JSON says besides its text: the model's name, the prompt's tokens (and as text), how
    the answer was sampled (generation_settings), whether it streamed."""

    model: str
    prompt: list[int]
    prompt_text: str
    settings: dict
    stream: bool = False


def final(made: Made, text: str, last, native: Native, logprobs: Optional[list] = None) -> dict:
    """The answer's last JSON (the whole answer, or a stream's last event, its content already sent)."""
    stats = last.stats
    out = {"index": 0, "content": "" if made.stream else text,
           "tokens": list(last.tokens) if native.return_tokens and not made.stream else [], "id_slot": -1, "stop": True,
           "model": made.model, "tokens_predicted": stats.generated_tokens, "tokens_evaluated": stats.prompt_tokens,
           "generation_settings": made.settings, "prompt": made.prompt_text, "has_new_line": "\n" in text,
           "truncated": False, "stop_type": _STOP_TYPES.get(last.finish_reason, "none"),
           "stopping_word": last.stop_sequence or "", "tokens_cached": _in_kv(stats),
           "timings": timings(stats)}
    if logprobs is not None and not made.stream:
        out["completion_probabilities"] = logprobs
    return kept(out, native.response_fields)


def _in_kv(stats) -> int:
    """The tokens the slot holds once the answer is done, as llama-server counts them: the prompt and the answer but
    its last token, which ended it unevaluated."""
    return stats.prompt_tokens + max(0, stats.generated_tokens - 1)


def kept(answer: dict, fields: list[str]) -> dict:
    """Only the fields a request asked for (llama-server's response_fields: a path such as generation_settings/n_predict
    names a field inside another), each under its path."""
    if not fields:
        return answer
    out = {}
    for path in fields:
        node: Any = answer
        for part in path.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out[path] = node
    return out


def probabilities(facts, entries: Optional[list], native: Optional[Native] = None, sampling=None) -> Optional[list]:
    """Tokens' logprobs (engine.TokenLogprob) as llama-server's completion_probabilities; with post_sampling_probs
    (`native.post_sampling`, `sampling` the answer's), the probabilities after the sampler chain, by its names
    (`prob`, `top_probs`)."""
    if entries is None:
        return None
    if native is not None and native.post_sampling and sampling is not None:
        return [_post_sampled(facts, e, sampling, native.n_probs) for e in entries]

    def one(token: int, logprob: float) -> dict:
        raw = facts.piece(token)
        return {"id": token, "token": raw.decode("utf-8", "ignore"), "bytes": list(raw), "logprob": logprob}

    return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]


def _post_sampled(facts, entry, sampling, n_probs: int) -> dict:
    def one(token: int, p: float) -> dict:
        raw = facts.piece(token)
        return {"id": token, "token": raw.decode("utf-8", "ignore"), "bytes": list(raw), "prob": p}

    chosen = after_sampling(entry, sampling)
    prob = next((p for t, p in chosen if t == entry.token), 0.0)
    return {**one(entry.token, prob), "top_probs": [one(t, p) for t, p in chosen[:n_probs] if p > 0.0]}


def after_sampling(entry, sampling) -> list[tuple[int, float]]:
    """The candidates left after llama.cpp's sampler chain and their probabilities, most likely first, from the
    model's distribution at one token (`entry`: its logprob and the most likely tokens', as many as top-k keeps), as
    llama-server's post_sampling_probs reports them: the bias, then top-k, typical, top-p and min-p (each keeping at
    least one token), the temperature, the softmax; greedy: the best token alone. The chain's steps that depend on
    the answer so far (penalties, DRY, a grammar) or on chance (XTC) are not replayed here."""
    logits = {t: lp for t, lp in entry.top}
    logits.setdefault(entry.token, entry.logprob)
    for t, bias in (sampling.logit_bias or {}).items():
        if t in logits:
            logits[t] += bias
    ranked = sorted(((lp, t) for t, lp in logits.items() if lp > -math.inf), reverse=True)
    if not ranked:
        return []
    if sampling.greedy:
        return [(ranked[0][1], 1.0)]
    if sampling.mirostat == 0:
        if sampling.top_k > 0:
            ranked = ranked[:sampling.top_k]
        if sampling.typical_p < 1.0:
            ranked = _typical(ranked, sampling.typical_p)
        if sampling.top_p < 1.0:
            ranked = _top_p(ranked, sampling.top_p)
        if sampling.min_p > 0.0:
            floor = ranked[0][0] + math.log(sampling.min_p)
            ranked = [r for r in ranked if r[0] >= floor]
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    probs = _softmax([lp / temperature for lp, _ in ranked])
    return sorted(((t, p) for (_, t), p in zip(ranked, probs)), key=lambda tp: -tp[1])


def _softmax(logits: list[float]) -> list[float]:
    peak = max(logits)
    exps = [math.exp(x - peak) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _top_p(ranked: list, p: float) -> list:
    """llama.cpp's top-p: the most likely tokens until their probabilities reach p."""
    total = 0.0
    for i, prob in enumerate(_softmax([lp for lp, _ in ranked])):
        total += prob
        if total >= p:
            return ranked[:i + 1]
    return ranked


def _typical(ranked: list, p: float) -> list:
    """llama.cpp's locally typical sampling: the tokens whose surprise is nearest the entropy, until their
    probabilities pass p; then back in order of likelihood."""
    probs = _softmax([lp for lp, _ in ranked])
    entropy = -sum(q * math.log(q) for q in probs if q > 0)
    order = sorted(range(len(ranked)), key=lambda i: abs(-math.log(probs[i]) - entropy) if probs[i] > 0 else math.inf)
    total, kept = 0.0, len(order)
    for n, i in enumerate(order):
        total += probs[i]
        if total > p:
            kept = n + 1
            break
    return sorted((ranked[i] for i in order[:kept]), reverse=True)


def indent_cut(text: str, n_indent: int) -> Optional[int]:
    """Where an answer ends under llama-server's n_indent: at the first line after a newline whose indentation
    (spaces, tabs) is under n_indent, once a character after that indentation shows it is whole; the line's
    indentation is kept, its text cut. None: not (yet)."""
    if n_indent <= 0:
        return None
    start = text.find("\n")
    while start != -1:
        pos = start + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - start - 1 < n_indent:
            return pos
        start = text.find("\n", start + 1)
    return None


async def indent_limited(events: AsyncIterator[Event], n_indent: int, stop,
                         piece: Optional[Callable[[int], bytes]] = None) -> AsyncIterator[Event]:
    """An answer's events ended as n_indent says (indent_cut): the text cut there, `stop()` called to stop the model,
    and the answer's end said as a limit reached (stop_type "limit", as llama-server's). What the model made after
    the cut is not the answer's: the event holding the cut keeps the tokens (and logprobs) up to it (`piece`: a
    token's bytes, to tell them), and tokens_predicted counts the tokens up to it (the model stops a step or more
    later)."""
    text, cut, predicted = "", False, 0
    async for e in events:
        if cut:
            if e.kind in ("done", "failed") and e.final is not None:
                final = replace(e.final, finish_reason="length", stop_sequence=None, error=None)
                if final.stats is not None:
                    final = replace(final, stats=replace(final.stats, generated_tokens=predicted))
                yield Event("done", final=final)
                return
            continue
        if e.kind == "text":
            at = indent_cut(text + e.text, n_indent)
            if at is not None:
                cut = True
                stop()
                if at > len(text):
                    e = _up_to(e, at - len(text), piece)
                    predicted += len(e.tokens) or 1
                    yield e
                continue
            text += e.text
            predicted += len(e.tokens) or 1
        yield e


def _up_to(e: Event, n: int, piece: Optional[Callable[[int], bytes]]) -> Event:
    """A text event cut to its first `n` characters, with the tokens (and their logprobs) that make them: the fewest
    whose text reaches n; all of them where a token's text is not known."""
    kept = len(e.tokens)
    if piece is not None:
        made = b""
        for i, token in enumerate(e.tokens):
            made += piece(token)
            if len(made.decode("utf-8", "ignore")) >= n:
                kept = i + 1
                break
    logprobs = e.logprobs[:kept] if len(e.logprobs) == len(e.tokens) else e.logprobs
    return replace(e, text=e.text[:n], tokens=list(e.tokens[:kept]), logprobs=list(logprobs))


async def lines(events: AsyncIterator[Event], made: Made, native: Native, facts=None, progress: bool = False,
                sampling=None) -> AsyncIterator[str]:
    """An answer's events as llama-server's stream: a server-sent event per piece ({content, tokens, stop: false,
    ...}), the last one the whole answer's fields without its text; no [DONE]. An error ends it. `progress`: the
    prompt's progress too (return_progress: prompt_progress's total, cache, processed)."""
    text, evaluated = "", len(made.prompt)
    predicted = 0
    async for e in events:
        if e.kind == "ping":
            yield ":\n\n"
        elif e.kind == "progress" and progress:
            yield _event({"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": 0,
                          "tokens_evaluated": evaluated, "prompt_progress": {"total": e.progress.total,
                          "cache": e.progress.cached, "processed": e.progress.processed, "time_ms": 0}})
        elif e.kind == "text":
            text += e.text
            predicted += len(e.tokens) or 1
            chunk = {"index": 0, "content": e.text, "tokens": list(e.tokens), "stop": False, "id_slot": -1,
                     "tokens_predicted": predicted, "tokens_evaluated": evaluated}
            if native.n_probs and facts is not None:
                chunk["completion_probabilities"] = probabilities(facts, e.logprobs, native, sampling)
            yield _event(chunk)
        elif e.kind == "failed":
            yield _event({"error": {"code": 500, "message": e.text, "type": "server_error"}})
        elif e.kind == "done":
            if e.tokens:  # the tokens of a stop word, their text cut: sent without it, as llama-server does
                predicted += len(e.tokens)
                yield _event({"index": 0, "content": "", "tokens": list(e.tokens), "stop": False, "id_slot": -1,
                              "tokens_predicted": predicted, "tokens_evaluated": evaluated})
            yield _event(final(made, text, e.final, native))


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def slots_answer(busy: list[bool], n_ctx: int, speculative: bool) -> list[dict]:
    """GET /slots: each slot's id, context and whether it is answering now, as llama-server lists them (without the
    last request's parameters, as its --slots gives them by default)."""
    return [{"id": i, "n_ctx": n_ctx, "speculative": speculative, "is_processing": b} for i, b in enumerate(busy)]


def props(facts, *, model: str, slots: int, slot_ctx: int, sampling_settings: dict, build: str) -> dict:
    """GET /props: the model, its context per slot, the slots, its chat template and special tokens, as llama-server
    answers."""
    return {"default_generation_settings": {"params": sampling_settings, "n_ctx": slot_ctx}, "total_slots": slots,
            "model_alias": model, "model_path": str(facts.path), "modalities": {"vision": False, "audio": False},
            "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
            "chat_template": facts.chat_template or "", "bos_token": facts.bos_text, "eos_token": facts.eos_text,
            "build_info": build, "is_sleeping": False}
