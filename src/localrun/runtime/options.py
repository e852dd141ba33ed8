"""Options as the layers above see them: the one list of sampling options (plain data, cheap to import for
the command line's flags), its one merge, decoding strategies and load-time settings (imported on use)."""

from ..engine.options import BY_NAME, KV_TYPES, SAMPLING, Option, cli_value, text_value
from ..lazy import exports

_WHERE = {
    "LoadOptions": "..engine.model", "parse_gpu_layers": "..engine.model",
    "OptionError": "..engine.sampling", "SamplingOptions": "..engine.sampling", "merge_options": "..engine.sampling",
    "json_grammar": "..engine.sampling",
    "DecodeOptions": "..engine.strategies",
}
__all__ = ["BY_NAME", "KV_TYPES", "SAMPLING", "Option", "cli_value", "text_value", *sorted(_WHERE)]
__getattr__ = exports(globals(), _WHERE)

# Ollama's option names (api.Options and api.Runner) where they are not localrun's own: what its clients send
# in `options`, chat's `/set parameter` and a Modelfile's PARAMETER lines name.
OLLAMA_RENAMED = {"num_predict": "max_tokens"}
OLLAMA_LOAD = {"num_ctx": "ctx", "num_gpu": "gpu_layers", "num_thread": "threads", "num_batch": "batch"}  # load-time
OLLAMA_IGNORED = ("num_keep", "penalize_newline", "numa", "main_gpu", "low_vram", "vocab_only", "use_mmap", "use_mlock", "tfs_z",
                  "f16_kv", "logits_all", "embedding_only", "rope_frequency_base", "rope_frequency_scale", "num_gqa")  # older clients send these
