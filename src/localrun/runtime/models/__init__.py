"""Models made here from others and what is said of them: `create`/`cp` and Ollama's /api/create and /api/copy
(create), `quantize` (quantize), and Ollama's `details` of a model read from its GGUF (details)."""
