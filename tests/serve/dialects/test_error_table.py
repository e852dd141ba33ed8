"""The one error table (serve.errors): every refusal's status, code and field at fault, the field named by the
dialect's wording; the runtime's typed errors as they are met (a load, an embedding, a model made)."""

from __future__ import annotations

import pytest

from localrun.engine.sampling import OptionError
from localrun.errors import ContextOverflow, InvalidModelFile, LocalrunError, ModelNotFound, SettingError, UnknownModel, UsageError
from localrun.runtime.images import BadImage, NoProjector
from localrun.runtime.serving.pool import LoadCancelled, ModelTooBig, PoolBusy
from localrun.runtime.serving.scheduler import QueueFull, ServerStopping
from localrun.serve.dialects import anthropic, native, ollama, openai, responses
from localrun.serve.errors import (EmbedFailed, Fault, InvalidField, LoadFailed, LoadRefused, MakeFailed, MissingField, PromptFailed,
                                   Refused, TooLong, UnknownField, Unsupported, Wording, failure_text, fault, is_refusal)

PLAIN = Wording(more_context="MORE", no_projector="PROJECTOR")
SHOUTING = Wording(more_context="MORE", no_projector="PROJECTOR", name_of=str.upper)


@pytest.mark.parametrize("exc, status, code, param", [
    (Refused("why", "f", status=409, code="busy"), 409, "busy", "F"),
    (InvalidField("use 1 or more", "max_tokens"), 400, None, "MAX_TOKENS"),
    (UnknownField(field="x"), 400, None, "X"),
    (MissingField(field="prompt"), 400, None, "PROMPT"),
    (Unsupported(field="audio"), 400, None, "AUDIO"),
    (TooLong(ContextOverflow("x", n_prompt=9, n_ctx=4), "prompt"), 400, "context_length_exceeded", "PROMPT"),
    (PromptFailed(TypeError("boom")), 400, None, None),
    (QueueFull(8), 429, "queue_full", None),
    (ServerStopping(), 503, None, None),
    (OptionError("temperature", -1, "use 0 or more"), 400, None, "TEMPERATURE"),
    (BadImage("messages.0.content.1", "not a URL string"), 400, "invalid_image", "messages.0.content.1"),
    (NoProjector("m.gguf", "images.0"), 400, "model_without_vision", "images.0"),
    (UsageError("a grammar that does not parse"), 400, None, None),
    (LocalrunError("llama.cpp failed"), 500, None, None),
    (LoadFailed(ModelNotFound("no"), "x"), 404, "model_not_found", "model"),
    (LoadFailed(ModelTooBig("too big"), "x"), 400, "model_too_big", "model"),
    (LoadFailed(PoolBusy("busy"), "x"), 503, "models_busy", "model"),
    (LoadFailed(LoadCancelled("gone"), "x"), 499, "cancelled", "model"),
    (LoadFailed(InvalidModelFile("no model"), "x"), 400, "invalid_model_file", "model"),
    (LoadFailed(UsageError("bad"), "x"), 400, "invalid_options", "LOAD"),
    (LoadFailed(LocalrunError("corrupt"), "x"), 500, "load_failed", "model"),
    (LoadRefused(SettingError("ctx", 0, "use 16 or more")), 400, None, "LOAD.CTX"),
    (EmbedFailed(UsageError("dimensions 7: this model makes 64")), 400, None, "dimensions"),
    (EmbedFailed(ContextOverflow("text 0 is 9 tokens but the context holds 4: shorten it", n_ctx=4)), 400, "context_length_exceeded", "input"),
    (MakeFailed(ModelNotFound("no such model"), "model 'x' not found"), 404, None, None),
    (MakeFailed(UsageError("bad Modelfile")), 400, None, None),
])
def test_each_refusal_once(exc, status, code, param):
    f = fault(exc, SHOUTING)
    assert (f.status, f.code, f.param) == (status, code, param) and is_refusal(exc)
    assert "\n" not in f.message and f.message


def test_the_messages_name_the_field_as_the_dialect_names_it():
    assert fault(InvalidField("use 1 or more", "max_tokens"), SHOUTING).message == "invalid 'MAX_TOKENS': use 1 or more"
    assert fault(Unsupported(field="echo"), PLAIN).message == "'echo' is not supported by localrun serve: leave it out"
    too_long = fault(TooLong(ContextOverflow("x", n_prompt=9, n_ctx=4), "prompt"), PLAIN)
    assert too_long.message.endswith("but the prompt is 9 tokens: shorten it, or MORE") and too_long.sizes == (9, 4)
    assert fault(NoProjector("m.gguf", "images.0"), PLAIN).message == "images.0: the model m.gguf has no image projector: PROJECTOR"
    assert fault(LoadRefused(SettingError("ctx", 0, "use 16 or more")), SHOUTING).message == "invalid LOAD.CTX 0: use 16 or more"
    assert fault(LoadFailed(UnknownModel("smollm", ["smollm2"]), "smollm"), PLAIN).message == (
        "unknown model 'smollm': did you mean smollm2? GET /v1/models lists the models this server has")
    assert fault(MakeFailed(ModelNotFound("no such model"), "model 'x' not found"), PLAIN).message == "model 'x' not found"
    assert fault(PromptFailed(TypeError("boom")), PLAIN).message == "cannot build the prompt: TypeError: boom"


def test_what_no_table_knows_is_the_servers_own_fault():
    assert not is_refusal(KeyError("x"))
    with pytest.raises(TypeError):
        fault(KeyError("x"), PLAIN)


def test_each_dialects_wording():
    """localrun's names in, the dialect's out; a name already the dialect's stays (what its translator named)."""
    assert [openai.WORDING.name_of(f) for f in ("max_tokens", "load.ctx", "load", "messages.1")] == [
        "max_tokens", "options.num_ctx", "options", "messages.1"]
    assert [responses.WORDING.name_of(f) for f in ("max_tokens", "messages.2.content", "response_format", "input.0", "tool_choice")] == [
        "max_output_tokens", "input", "text.format", "input.0", "tool_choice"]
    assert [ollama.WORDING.name_of(f) for f in ("max_tokens", "temperature", "load.threads", "messages.0.role", "options.num_ctx")] == [
        "options.num_predict", "options.temperature", "options.num_thread", "messages.0.role", "options.num_ctx"]
    assert anthropic.WORDING.name_of("max_tokens") == "max_tokens"
    assert "--ctx" in openai.WORDING.more_context and "options.num_ctx" in ollama.WORDING.more_context


def test_the_kinds_of_error_by_status_and_each_dialects_busy_answer():
    assert [Fault(s, "x").kind for s in (400, 404, 413, 429, 499, 500, 503)] == [
        "invalid_request_error", "invalid_request_error", "request_too_large", "rate_limit_error", "server_error", "server_error",
        "server_error"]
    assert Fault(429, "x").headers == Fault(503, "x").headers == {"Retry-After": "1"} and Fault(400, "x").headers is None
    status, body = native.error_answer(native.RunRefused(409, "other build", 1, code="other_build", busy=False))
    assert status == 409 and body == {"error": "other build", "exit": 1, "code": "other_build", "busy": False}


def test_a_stream_that_fails_on_its_way_says_so_in_its_own_words():
    assert failure_text(ServerStopping()) == "the server is shutting down: retry later"
    assert failure_text(ServerStopping("the model's worker was lost")) == "the model's worker was lost"
    assert failure_text(UsageError("bad grammar")) == "bad grammar" and failure_text(MemoryError()) == "out of memory"
    assert failure_text(ValueError("x")) == "ValueError: x"
