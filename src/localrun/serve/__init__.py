"""HTTP dialects over the runtime: the OpenAI API (/v1), its SSE streams, health and Prometheus metrics."""
