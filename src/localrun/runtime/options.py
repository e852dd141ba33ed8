"""Options as the layers above see them: the one list of sampling options (and its one merge), decoding
strategies and load-time settings."""

from ..engine.model import KV_TYPES, LoadOptions, parse_gpu_layers
from ..engine.sampling import OptionError, SamplingOptions, cli_options, cli_value, merge_options, text_value
from ..engine.strategies import DecodeOptions

__all__ = ["KV_TYPES", "DecodeOptions", "LoadOptions", "OptionError", "SamplingOptions", "cli_options", "cli_value",
           "merge_options", "parse_gpu_layers", "text_value"]
