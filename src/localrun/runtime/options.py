"""Options as the layers above see them: the one list of sampling options (plain data, cheap to import for
the command line's flags), its one merge, decoding strategies and load-time settings (imported on use)."""

from ..engine.options import BY_NAME, SAMPLING, Option, cli_value, text_value
from ..lazy import exports

_WHERE = {
    "KV_TYPES": "..engine.model", "LoadOptions": "..engine.model", "parse_gpu_layers": "..engine.model",
    "OptionError": "..engine.sampling", "SamplingOptions": "..engine.sampling", "merge_options": "..engine.sampling",
    "json_grammar": "..engine.sampling",
    "DecodeOptions": "..engine.strategies",
}
__all__ = ["BY_NAME", "SAMPLING", "Option", "cli_value", "text_value", *sorted(_WHERE)]
__getattr__ = exports(globals(), _WHERE)
