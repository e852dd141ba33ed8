"""The one decode loop. A step builds one llama.cpp batch from the tasks that have work, decodes it, and hands
each task its outputs; a task (plain sampling here, speculative decoding, beam search and perplexity in
strategies.py) says which tokens go into the batch and what to do with the logits. `run` and `chat` are a
batch of one task; the server's scheduler puts one task per slot in the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Optional

from ..errors import UsageError
from .model import Batch, DecodeError, Engine
from .sampling import Sampler, SamplingOptions
from .sequence import SequenceState
from .types import Progress, Response, TokenLogprob


class Task:
    """One unit of work for the step: `schedule` puts its tokens in the batch (False: nothing this step),
    `consume` reads its outputs after the decode and returns what it produced."""

    done = False
    seq: Optional[SequenceState] = None

    def schedule(self, batch: Batch) -> bool:
        raise NotImplementedError

    def consume(self) -> list[Response]:
        raise NotImplementedError

    def interrupt(self, reason: str = "interrupted", error: Optional[str] = None) -> Response:
        """End it now (Ctrl-C, a client gone, a failed batch): its last response."""
        self.done = True
        if self.seq is None:
            return Response(finish_reason=reason, error=error)
        return self.seq.finish(reason, error=error)

    def close(self) -> None:
        pass


def step(engine: Engine, batch: Batch, tasks: Sequence[Task]) -> list[tuple[Task, Response]]:
    """One batched decode for `tasks` (in batch order), then each task's outputs. A refused batch raises
    DecodeError with `tasks` set to the tasks that were in it."""
    batch.clear()
    scheduled = [t for t in tasks if t.schedule(batch)]
    if not scheduled:
        return []
    try:
        engine.decode(batch)
    except DecodeError as exc:
        exc.tasks = scheduled
        raise
    return [(task, response) for task in scheduled for response in task.consume()]


class Prefill(Task):
    """Evaluates a prompt into one KV sequence, in chunks of at most `chunk` tokens, reusing the longest
    prefix the sequence already holds. The last prompt token's logits are left to sample from (`row`).
    A prompt with images (runs of negative ids: engine.vision) has each image evaluated on its own as the
    prefill reaches it (`evaluate_images`, between two steps: llama.cpp decodes an image's embeddings in
    batches of their own), and its text in the step's batch like any prompt's."""

    def __init__(self, engine: Engine, prompt: Sequence[int], *, seq_id: int = 0, chunk: Optional[int] = None,
                 reused: Optional[int] = None):
        self.engine = engine
        self.prompt = prompt
        self.seq_id = seq_id
        self.chunk = max(1, chunk or engine.n_batch)
        self.n_done = engine.kv.reuse(seq_id, prompt) if reused is None else reused  # prompt tokens in the KV
        self.cached = self.n_done
        self.row = -1
        self._taking = 0
        self._images = getattr(engine, "vision", None) is not None and any(t < 0 for t in prompt)

    @property
    def prefilled(self) -> bool:
        return self.n_done == len(self.prompt)

    def schedule(self, batch: Batch) -> bool:
        return self.schedule_prompt(batch)

    def image_pending(self) -> bool:
        """Whether the prefill has reached an image (evaluated by `evaluate_images`, not in a batch)."""
        return self._images and self.n_done < len(self.prompt) and self.prompt[self.n_done] < 0

    def evaluate_images(self) -> None:
        """The images where the prefill stands, into the KV now (engine.vision.evaluate). Raises what refused
        them (EngineError, UsageError)."""
        while self.image_pending():
            self.n_done = self.engine.vision.evaluate(self.seq_id, self.prompt, self.n_done)

    def schedule_prompt(self, batch: Batch) -> bool:
        # A chunk's size depends only on its prompt, never on the load (a chunk that does not fit waits a
        # step): llama.cpp's kernels round differently for other batch shapes, and one request's output must
        # not depend on what else runs. Text stops at an image (a prompt never ends with one).
        take = min(len(self.prompt) - self.n_done, self.chunk)
        if self._images:
            self.evaluate_images()
            end = self.n_done
            while end < len(self.prompt) and end - self.n_done < self.chunk and self.prompt[end] >= 0:
                end += 1
            take = end - self.n_done
        if take > batch.room():
            return False
        start = self.n_done
        batch.add_span(self.prompt[start : start + take], len(self.engine.kv.tokens[self.seq_id]), self.seq_id)
        if start + take == len(self.prompt):
            self.row = batch.n - 1
            batch.want_output(self.row)
        self._taking = take
        return True

    def progress(self) -> Response:
        """A response with no text that says how far the prompt is (a long prompt's progress, the cached part)."""
        return Response(progress=Progress(len(self.prompt), self.cached, self.n_done))

    def prompt_done(self) -> bool:
        """After a prompt chunk's decode: whether the whole prompt is in now."""
        self.n_done += self._taking
        self._taking = 0
        return self.prefilled

    def consume(self) -> list[Response]:
        self.done = self.prompt_done()
        return []


def token_logprob(logits, token: int, top_n: int) -> TokenLogprob:
    """`token`'s log-probability in the softmax of a logits row, and the `top_n` most likely tokens'
    (most likely first): the model's own distribution, before any sampler, as OpenAI's API reports it."""
    import numpy as np

    row = np.asarray(logits, dtype=np.float64)
    peak = row.max()
    log_total = peak + np.log(np.exp(row - peak).sum())
    top: list[tuple[int, float]] = []
    if top_n > 0:
        best = np.argpartition(-row, top_n - 1)[:top_n] if top_n < row.size else np.arange(row.size)
        best = best[np.argsort(-row[best], kind="stable")]
        top = [(int(i), float(row[i] - log_total)) for i in best]
    return TokenLogprob(token, float(row[token] - log_total), top)


class Plain(Prefill):
    """Sampling: the prompt, then one token per step, each chosen by the request's sampler chain."""

    def __init__(self, engine: Engine, seq: SequenceState, sampler: Sampler, *, chunk: Optional[int] = None,
                 reused: Optional[int] = None, prefilter: bool = False):
        super().__init__(engine, seq.prompt, seq_id=seq.seq_id, chunk=chunk, reused=reused)
        self.seq = seq
        self.sampler = sampler
        seq.force = sampler.force  # (a thinking budget spent: its end marker)
        seq.stats.cached_tokens = self.cached
        self.next_token: Optional[int] = None  # sampled, to be decoded at the next step
        self.prefiltered = prefilter
        sampler.accept_prompt(seq.prompt)  # repetition penalties see the prompt, as llama.cpp's server does

    def schedule(self, batch: Batch) -> bool:
        if self.next_token is None:
            return self.schedule_prompt(batch)
        self.row = batch.add(self.next_token, len(self.engine.kv.tokens[self.seq_id]), self.seq_id, True)
        return True

    def consume(self) -> list[Response]:
        if self.next_token is None:
            if not self.prompt_done():
                return [self.progress()]
            if self.prefiltered and self.engine.prefilter_failed(self.row):
                # The device could not run the top-k (llama.cpp left the whole vocabulary, without ids, for
                # the chain to read): sample on the CPU as usual, from the last token evaluated once more.
                self.prefiltered = False
                self.engine.kv.truncate(self.seq_id, len(self.engine.kv.tokens[self.seq_id]) - 1)
                self.n_done -= 1
                return []
        self.seq.before_sample()
        token = self.sampler.sample(self.engine.ctx, len(self.seq.generated), self.row, self.prefiltered)
        logprob = None if self.seq.top_logprobs is None else token_logprob(self.engine.logits(self.row), token, self.seq.top_logprobs)
        first = not self.seq.generated
        response = self.seq.push(token)
        if first:  # the prompt is in: its last progress rides on the first token
            response.progress = Progress(len(self.prompt), self.cached, len(self.prompt))
        # (not for the token that completed a stop sequence and adds no text: its text is cut, as llama-server's)
        if logprob is not None and response.tokens and not (response.stop_sequence is not None and not response.text):
            response.logprobs = [logprob]
        if response.done:
            self.done, self.next_token = True, None
        else:
            self.next_token = token
        return [response]

    def close(self) -> None:
        self.sampler.close()


def drive(engine: Engine, tasks: Sequence[Task], cancelled: Optional[Callable[[], bool]] = None) -> Iterator[Response]:
    """Step the tasks with the engine's own batch until every one is done. `cancelled` is asked before each
    step: once true, each task ends with finish reason 'interrupted'. A consumer that stops early (a closed
    pipe) leaves the KV cache consistent: it is only ever touched between yields."""
    batch = engine.batch
    live = list(tasks)
    while live:
        if cancelled is not None and cancelled():
            for task in live:
                yield task.interrupt()
            return
        for _, response in step(engine, batch, live):
            yield response
        live = [t for t in live if not t.done]


class PlainStrategy:
    """One token per step with the request's sampler chain: the default."""

    def task(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions, n_ctx: Optional[int] = None) -> Task:
        sampler = Sampler(engine, sampling)
        try:
            prefilter = engine.prefilter_for(sampler.prefilter)
            return Plain(engine, SequenceState(engine, prompt, sampling, n_ctx=n_ctx), sampler, prefilter=prefilter)
        except BaseException:
            sampler.close()
            raise

    def close(self) -> None:
        pass


PLAIN = PlainStrategy()


def generate(engine: Engine, prompt: Sequence[int], sampling: SamplingOptions, *, strategy=None,
             cancelled: Optional[Callable[[], bool]] = None, thinking=None) -> Iterator[Response]:
    """Stream the answer to `prompt` (token ids): text responses, then one with the finish reason and stats.
    `strategy` (strategies.make_strategy) decodes instead of plain sampling: speculative decoding, beams.
    `thinking` (a thinking.ThinkingSplitter): a reasoning model's thinking goes to Response.thinking."""
    if not prompt:
        raise UsageError("empty prompt: give some text as an argument or on stdin")
    strategy = strategy or PLAIN
    limit = getattr(strategy, "ctx_limit", None)
    engine.check_fits(len(prompt), limit)
    task = strategy.task(engine, prompt, sampling, limit)
    if thinking is not None and getattr(task, "seq", None) is not None:  # beams keep several sequences: not split
        task.seq.thinking = thinking
    try:
        yield from drive(engine, [task], cancelled)
    finally:
        task.close()


def evaluate(engine: Engine, tokens: Sequence[int], seq_id: int = 0) -> int:
    """Put `tokens` in a sequence's KV (reusing what it holds), logits of the last one ready; returns how
    many were reused."""
    task = Prefill(engine, tokens, seq_id=seq_id)
    for _ in drive(engine, [task]):
        pass
    return task.cached
