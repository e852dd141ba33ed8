"""The server's Prometheus metrics (/metrics), in their own registry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..runtime import Stats
from ..runtime.serving.pool import ModelPool


class Metrics:
    """Prometheus metrics in their own registry (prometheus_client is thread-safe)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("localrun_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("localrun_prompt_tokens", "prompt tokens received", registry=r)
        self.cached_tokens = Counter("localrun_prompt_tokens_cached", "prompt tokens reused from the KV cache", registry=r)
        self.generated_tokens = Counter("localrun_generated_tokens", "tokens generated", registry=r)
        self.draft_tokens = Counter("localrun_draft_tokens", "tokens proposed by speculative decoding", registry=r)
        self.draft_accepted = Counter("localrun_draft_accepted_tokens", "proposed tokens the model agreed with", registry=r)
        self.ttft = Histogram(
            "localrun_time_to_first_token_seconds", "from request to first token", registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tpot = Histogram(
            "localrun_time_per_output_token_seconds", "per token after the first", registry=r,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1),
        )
        self.batch_tokens = Histogram(
            "localrun_batch_tokens", "tokens per decode step (decoding sequences plus prompt chunks)", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        )
        self.decoding = Histogram(
            "localrun_batch_sequences", "sequences decoding together per step", registry=r,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
        )

    def watch(self, pool: ModelPool) -> None:
        """Gauges over every resident model's scheduler, summed (one model: that model's)."""
        r = self.registry

        def total(of) -> Callable[[], float]:
            return lambda: sum(of(resident) for resident in list(pool.residents))

        Gauge("localrun_models_loaded", "models held in memory", registry=r).set_function(lambda: len(pool.residents))
        Gauge("localrun_requests_running", "requests holding a slot", registry=r).set_function(total(lambda m: m.scheduler.stats.running))
        Gauge("localrun_requests_waiting", "requests queued for a slot", registry=r).set_function(total(lambda m: m.scheduler.stats.waiting))
        Gauge("localrun_kv_cache_tokens", "tokens held in the slots' KV sequences", registry=r).set_function(total(lambda m: m.scheduler.stats.kv_tokens))
        Gauge("localrun_kv_cache_capacity_tokens", "tokens the KV caches hold", registry=r).set_function(total(lambda m: m.slot_ctx * len(m.scheduler.slots)))
        Gauge("localrun_slots", "sequence slots", registry=r).set_function(total(lambda m: len(m.scheduler.slots)))

    def step(self, batch_tokens: int, decoding: int) -> None:
        self.batch_tokens.observe(batch_tokens)
        if decoding:
            self.decoding.observe(decoding)

    def finished(self, stats: Stats) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.generated_tokens.inc(stats.generated_tokens)
        self.draft_tokens.inc(stats.draft_tokens)
        self.draft_accepted.inc(stats.draft_accepted)
        if stats.generated_tokens:
            self.ttft.observe(stats.ttft_s)
        if stats.generated_tokens > 1:
            self.tpot.observe(stats.tpot_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
