"""The only package that touches llama.cpp: a model and its context, the tokenizer, the prompt renderer, the
sampler chain, the KV cache and prefix reuse, and the one decode loop with its strategies."""

from .generate import generate
from .llama import build_id, default_threads, llama_cpp_module, system_info
from .model import KV_TYPES, PREFILTER_K, Engine, LoadOptions, parse_gpu_layers
from .sampling import OptionError, SamplingOptions, merge_options
from .strategies import DecodeOptions
from .types import Response, Stats

__all__ = [
    "KV_TYPES", "PREFILTER_K", "DecodeOptions", "Engine", "LoadOptions", "OptionError", "Response", "SamplingOptions",
    "Stats", "build_id", "default_threads", "generate", "llama_cpp_module", "merge_options", "parse_gpu_layers",
    "system_info",
]
