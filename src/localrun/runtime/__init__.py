"""Requests to responses: loading a model by its options, the request path (prompt, session or prefix
cache, decoding), conversations, continuous batching for the server, benchmarks and reports. The layers
above (serve, cli) reach the engine only through here. Names are imported on first use (see engine)."""

from importlib import import_module

_WHERE = {
    "DecodeOptions": "..engine", "OptionError": "..engine", "Response": "..engine", "SamplingOptions": "..engine",
    "Stats": "..engine", "merge_options": "..engine", "Loaded": ".loader", "load": ".loader", "Request": ".request",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name], __package__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
