"""Requests to responses: loading a model by its options, the request path (prompt, session or prefix
cache, decoding), conversations, continuous batching for the server, benchmarks and reports. The layers
above (serve, cli) reach the engine only through here. Names are imported on first use (see engine).

The parts, by who uses them: this package's own modules are the request path every front end takes (request,
generate, conversation, loader, options, sessions, images, ...); serving/ is what a server keeps and runs (the
model pool, the scheduler); client/ is the command line's standard-library client of a server; reports/ is bench,
show and doctor; models/ is create, cp and quantize."""

from ..lazy import exports

_WHERE = {
    "DecodeOptions": "..engine", "OptionError": "..engine", "Response": "..engine", "SamplingOptions": "..engine",
    "Stats": "..engine", "merge_options": "..engine", "Loaded": ".loader", "load": ".loader", "Request": ".request",
    # tool calls and thinking in a model's own format, for the HTTP dialects
    "call_schema": "..engine.tools", "supports_tools": "..engine.formats", "parser_for": "..engine.formats",
    "family_for": "..engine.formats", "AnswerStream": "..engine.formats", "forced_grammar": "..engine.formats.grammar",
    "markers_for": "..engine.thinking",
    # a GGUF file's header (its quant, chat template) for what the command line shows
    "read_info": "..engine.gguf_info",
    # what the sampler chain would refuse, checked as a request is translated
    "SchemaError": "..engine.json_schema", "check_bias_tokens": "..engine.sampling", "json_schema_grammar": "..engine.sampling",
}
__all__ = sorted(_WHERE)
__getattr__ = exports(globals(), _WHERE)
