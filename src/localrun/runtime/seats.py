"""The places a request is answered in: this process's loaded model (InProcess, one request at a time on its one
sequence); a resident server's slots are the other (runtime.serving.scheduler.Scheduler, SlotSeat)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Optional

from ..engine import Response, generate as engine_generate
from ..engine.lora import lora_key
from .loader import Loaded
from .sessions import EngineSeat


class InProcess(EngineSeat):
    """Requests answered in this process: on the loaded model's one sequence, with its decoding strategy.
    The place a request path works in (`hold` a seat for a prompt); a resident server's slots are the
    other (runtime.serving.scheduler.Scheduler)."""

    def __init__(self, loaded: Loaded):
        super().__init__(loaded.engine)
        self.loaded = loaded

    @contextmanager
    def hold(self, tokens: Sequence[int] = (), *, lora: Optional[Sequence[float]] = None, **waiting) -> Iterator["InProcess"]:
        """The engine's one sequence (one request at a time in this process: never waits), under the LoRA scales
        `lora` (None: the model's own): what it holds from other scales is dropped."""
        engine = self.engine
        scales = tuple(engine.lora_defaults if lora is None else lora)
        if not engine.kv.matches(0, lora_key(scales)):
            engine.reset()
        engine.use_lora(scales)
        yield self

    def held(self, tokens: Sequence[int] = ()) -> int:
        """Tokens in the KV cache now."""
        return len(self.tokens)

    def generate(self, tokens: list[int], sampling, *, cancelled=None, thinking=None, top_logprobs=None,
                 draft_max=None) -> Iterator[Response]:
        if top_logprobs is not None:
            from ..errors import UsageError

            raise UsageError("log-probabilities are given by the server's slots only")
        if self.engine.vision is not None and any(t < 0 for t in tokens):  # images: evaluated by the loop's prefill
            self.engine.check_fits(len(tokens))
            self.engine.vision.check(tokens)
        return engine_generate(self.engine, tokens, sampling, strategy=self.loaded.strategy, cancelled=cancelled, thinking=thinking)

    def reset(self) -> None:
        self.engine.reset()
