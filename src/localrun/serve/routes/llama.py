"""llama-server's own endpoints (serve.dialects.llama): /completion (and /completions, llama-server's name for the
same), /infill, /tokenize, /detokenize, /props, /slots and /lora-adapters, on the model a body names (the server's own when
it names none), answered on the request path every dialect takes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..asked import Asked
from ..dialects import llama
from .. import access
from ..endpoint import (Held, answered_by, answering, cancelled_on_disconnect, count, counted_events, endpoint, fingerprint, holding,
                        named, read_json, service_of, streamed, whole)
from ..stream import answer_events
from ..errors import Refused


async def _body(request: Request) -> Any:
    return await read_json(request, empty=b"{}")


def _model(request: Request, data: Any = None) -> Asked:
    """The model a request names: its body's `model`, else ?model=, else the server's own."""
    given = data.get("model") if isinstance(data, dict) else None
    given = given or request.query_params.get("model")
    if given is not None and not isinstance(given, str):
        raise Refused("model must be a string", "model")
    named(request, given)
    return Asked(model=given)


@endpoint("/completion", llama)
async def completion(request: Request):
    asked, native = llama.completion_asked(await _body(request))
    named(request, asked.model)
    answers = []
    try:
        for prompt in native.prompts:  # several prompts: an answer each, decoded side by side in the slots
            async with holding(request, asked) as held:
                one = replace(asked, prompt=llama.prompt_tokens(prompt, held.facts),
                              logit_bias=llama.logit_bias_of(native.logit_bias, held.facts))
                answers.append((await answering(request, held, _probed(one, native, held)), held))
        if asked.reply.stream:
            answer, held = answers[0]
            return _streamed(request, answer, held, asked, native)
        replies = [await _whole(request, answer, held, asked, native) for answer, held in answers]
    except Exception:
        for answer, _ in answers:
            answer.cancel()
        raise
    return JSONResponse(replies[0] if len(replies) == 1 else [{**r, "index": i} for i, r in enumerate(replies)])


def _probed(asked: Asked, native: llama.Native, held: Held) -> Asked:
    """post_sampling_probs: the model's most likely tokens at each step, as many as the sampler chain may keep
    (dialects.llama.after_sampling reads them)."""
    if not native.post_sampling:
        return asked
    base, given = held.facts.sampling, asked.sampling
    top_k, mirostat = given.get("top_k", base.top_k), given.get("mirostat", base.mirostat)
    window = held.facts.n_vocab if top_k <= 0 or mirostat else min(top_k, held.facts.n_vocab)
    return replace(asked, top_logprobs=max(window, native.n_probs))


def _streamed(request: Request, answer, held: Held, asked: Asked, native: llama.Native):
    wire = llama.lines(_events(request, answer, native, held), _made(request, held, answer, asked), native, held.facts,
                       progress=asked.reply.progress, sampling=answer.request.sampling)
    return streamed(request, answer, wire)


def _events(request: Request, answer, native: llama.Native, held: Held):
    """The answer's events, counted; under n_indent, ended at the first line indented less (the answer stopped)."""
    if not native.n_indent:
        return counted_events(request, answer)

    async def limited():
        async for event in llama.indent_limited(answer_events(answer), native.n_indent, answer.cancel, held.facts.piece):
            if event.kind in ("done", "failed"):  # (as counted_events counts them)
                count(request, 200 if event.kind == "done" else 500)
                if event.final is not None and event.final.stats is not None:
                    access.note(request, stats=event.final.stats)
            yield event
    return limited()


async def _whole(request: Request, answer, held: Held, asked: Asked, native: llama.Native) -> dict:
    if native.n_indent:
        text, final = await _gathered(request, answer, native, held)
    else:
        text, final = await whole(request, answer)
    logprobs = (llama.probabilities(held.facts, final.logprobs, native, answer.request.sampling)
                if answer.request.top_logprobs is not None else None)
    return llama.final(_made(request, held, answer, asked), text, final, native, logprobs)


async def _gathered(request: Request, answer, native: llama.Native, held: Held):
    """The whole answer read from its events (whole() reads the model's, which n_indent cuts short)."""
    parts, tokens, logprobs = [], [], []
    async with cancelled_on_disconnect(request, answer):
        async for event in _events(request, answer, native, held):
            if event.kind == "text":
                parts.append(event.text)
                tokens += event.tokens
                logprobs += event.logprobs
            elif event.kind == "failed":
                raise Refused(event.text, status=500)
            elif event.kind == "done":
                final = replace(event.final, tokens=tokens + list(event.tokens),
                                logprobs=logprobs if answer.request.top_logprobs is not None else None)
                return "".join(parts), final
    raise Refused("the answer ended without its end", status=500)


def _made(request: Request, held: Held, answer, asked: Asked) -> llama.Made:
    request_lora = answer.request.lora
    scales = request_lora if request_lora is not None else tuple(a["scale"] for a in held.facts.adapters)
    settings = llama.generation_settings(answer.request.sampling, stream=asked.reply.stream, lora=scales,
                                         n_predict=asked.max_tokens or -1)
    tokens = list(answer.prompt.tokens) if answer.prompt is not None else []
    return llama.Made(answered_by(request, asked, held.resident), tokens, held.facts.detokenize(tokens), settings, asked.reply.stream)


@endpoint("/infill", llama)
async def infill(request: Request):
    """Fill in the middle, as llama.vim and llama.vscode ask for it: the code before and after the cursor, other
    files for context; the model's FIM tokens (a code model's: Qwen2.5-Coder, CodeLlama, StarCoder...)."""
    asked, native, parts = llama.infill_asked(await _body(request))
    named(request, asked.model)
    async with holding(request, asked) as held:
        facts, resident = held.facts, held.resident
        base = facts.sampling
        n_predict = asked.max_tokens or (base.max_tokens if "max_tokens" in base.model_fields_set else -1)
        tokens = facts.infill_prompt(parts.prefix, parts.suffix, parts.extra, facts.tokens_of(parts.prompt),
                                     n_batch=resident.spec.batch, n_predict=n_predict, n_ctx=resident.slot_ctx)
        if tokens is None:
            raise Refused(f"Infill is not supported by this model: {facts.file_name} has no fill-in-the-middle tokens: use a"
                          " code model that has them (Qwen2.5-Coder, CodeLlama, StarCoder, ...)", "model", status=501,
                          code="not_supported")
        one = replace(asked, prompt=tokens, logit_bias=llama.logit_bias_of(native.logit_bias, facts))
        answer = await answering(request, held, _probed(one, native, held))
    if asked.reply.stream:
        return _streamed(request, answer, held, asked, native)
    return JSONResponse(await _whole(request, answer, held, asked, native))


@endpoint("/tokenize", llama)
async def tokenize(request: Request):
    data = await _body(request)
    async with holding(request, _model(request, data)) as held:
        return JSONResponse(llama.tokenize_answer(data, held.facts))


@endpoint("/detokenize", llama)
async def detokenize(request: Request):
    data = await _body(request)
    async with holding(request, _model(request, data)) as held:
        return JSONResponse(llama.detokenize_answer(data, held.facts))


@endpoint("/props", llama, methods=("GET",))
async def props(request: Request):
    """The model (the server's own, or ?model=): its template, context per slot, slots, as llama-server answers."""
    async with holding(request, _model(request)) as held:
        facts, resident = held.facts, held.resident
        base = facts.sampling  # (a length nobody set: until the slot is full, as a request is answered)
        settings = llama.generation_settings(base, stream=False, lora=tuple(a["scale"] for a in facts.adapters),
                                             n_predict=base.max_tokens if "max_tokens" in base.model_fields_set else -1)
        return JSONResponse(llama.props(facts, model=service_of(request).name_of(resident), slots=resident.spec.parallel, slot_ctx=resident.slot_ctx,
                                        sampling_settings=settings, build=fingerprint()))


@endpoint("/slots", llama, methods=("GET",))
async def slots(request: Request):
    """The model's slots (the server's own, or ?model=), as llama-server's monitoring endpoint lists them: which are
    answering now (a client that went away leaves its slot free)."""
    async with holding(request, _model(request)) as held:
        scheduler = held.resident.scheduler
        busy = [not slot.free for slot in scheduler.slots]
        return JSONResponse(llama.slots_answer(busy, held.resident.slot_ctx, scheduler.lookup > 0))


@endpoint("/lora-adapters", llama, methods=("GET",))
async def lora_adapters(request: Request):
    """The model's LoRA adapters (the server's own, or ?model=): id, path, the scale a request naming none gets."""
    async with holding(request, _model(request)) as held:
        return JSONResponse(held.facts.adapters)


@endpoint("/lora-adapters", llama, methods=("POST",))
async def set_lora_adapters(request: Request):
    """[{"id", "scale"}]: the scales every later request that names none is answered under (those left out: 0),
    while the model stays loaded."""
    entries = llama.lora_entries(await _body(request))
    async with holding(request, _model(request)) as held:
        held.facts.set_lora_defaults(entries)
    return JSONResponse({"success": True})


ROUTES = [completion, infill, tokenize, detokenize, props, slots, lora_adapters, set_lora_adapters]
