"""Requests to responses: loading a model by its options, the request path (prompt, session or prefix
cache, decoding), conversations, continuous batching for the server, benchmarks and reports. The layers
above (serve, cli) reach the engine only through here."""

from ..engine import DecodeOptions, OptionError, Response, SamplingOptions, Stats, merge_options
from .load import Loaded, load
from .request import Request

__all__ = ["DecodeOptions", "Loaded", "OptionError", "Request", "Response", "SamplingOptions", "Stats", "load", "merge_options"]
