"""The only package that touches llama.cpp: a model and its context, the tokenizer, the prompt renderer, the
sampler chain, the KV cache and prefix reuse, and the one decode loop with its strategies.

Names are imported from their modules on first use, so that importing a light module of this package (the
option list) does not load pydantic or the rest.
"""

from ..lazy import exports

_WHERE = {
    "generate": ".loop", "build_id": ".llama", "default_threads": ".llama", "llama_cpp_module": ".llama",
    "system_info": ".llama", "KV_TYPES": ".model", "PREFILTER_K": ".model", "Engine": ".model", "LoadOptions": ".model",
    "parse_gpu_layers": ".model", "OptionError": ".sampling", "SamplingOptions": ".sampling", "merge_options": ".sampling",
    "DecodeOptions": ".strategies", "Response": ".types", "Stats": ".types", "TokenLogprob": ".types",
}
__all__ = sorted(_WHERE)
__getattr__ = exports(globals(), _WHERE)
