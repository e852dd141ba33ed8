"""What the command line reports rather than answers: `localrun bench` (bench: speed, memory and perplexity
beside llama.cpp's own tools) and `show`/`doctor` (report: a model's metadata and memory, the build and the
machine)."""
