"""localrun: run GGUF quantized language models from the terminal, on llama.cpp."""

__version__ = "0.1.0"
