"""A multi-turn conversation with one loaded model, its KV cache reused from turn to turn.

Each turn is a runtime Request answered by the request path's pieces, as run's and the HTTP dialects' are: its
prompt by runtime.request.prompt_for (the template, the image markers, the one drop-oldest policy), its answer by
the place's seat (the decode loop, the stops its prompt needs, the thinking splitter). Not by runtime.generate
itself: that serves a request made whole each time (the model's default system prompt and preset messages added,
a named session read from disk and saved after every answer, the automatic prefix cache), while a conversation
keeps its messages here, edited by the REPL, and saves them when asked.

Each turn's prompt is the previous turn's tokens (prompt, then the answer exactly as it was generated)
followed by the tokens of what the template adds after them (the end of the answer, the new message, the
assistant header), as llama.cpp's own llama-cli does (Request.extends). So only those new tokens
are evaluated. If the template renders the history differently from the last prompt (or after a load, a
new system prompt), the whole conversation is tokenised again and the engine still reuses whatever prefix
matches. When the conversation no longer leaves the answer its room, the oldest turns after the system prompt
are dropped in blocks of at least half that room (runtime.request._drop_oldest), and forgotten: the next turns
extend the new prompt until it is full again.

A user message may carry images ("images": engine.vision.Image, placed before its text as `run --image` places
them): they stay in the conversation, so every later prompt holds them too, as negative ids keyed by the
sha256 of their bytes (engine.vision), and the KV they were evaluated into is reused like text's, not encoded
again. A session keeps them inside its messages (each as its sha256, name and bytes in base64: `stored`), so
a resumed session's prompt, and its answers, are the same.

A conversation answered in this process is this process's chat: it holds the writer lock of every session it
opens, loads or saves until it ends (store.writers), so no other chat or run can write them meanwhile. One the
background server keeps for a chat client (`place` given) takes none: its client holds them (runtime.client.remote).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..engine import Response, SamplingOptions
from ..engine.types import Progress
from ..engine.kv import common_prefix
from ..engine.prompt import render
from ..engine.vision import Image
from ..errors import ContextOverflow, LocalrunError, Phrase
from ..store.writers import SessionClaims
from .loader import Loaded
from .messages import Messages
from .request import Prompt, Request, kept_room, marked, prompt_for, with_stops
from .images import live, stored
from .seats import InProcess
from .sessions import Sessions


class Conversation(Messages):
    """The messages, and the tokens that the engine's KV cache mirrors for them."""

    def __init__(self, loaded: Loaded, system: Optional[str], place=None, mmproj: Optional[Path | str] = None):
        """`mmproj`: the projector for the conversation's images (chat --mmproj); by default the one named for
        the model in this process (serve MODEL --mmproj) or the one beside its file, loaded with the first image."""
        self.loaded = loaded
        self.mmproj = mmproj
        self.engine = loaded.engine
        self.place = place or InProcess(loaded)  # where its turns are answered (a resident server's slots)
        self.claims = SessionClaims() if place is None else None  # None: the chat client holds them
        self.templated = self.engine.chat_template is not None
        self.messages: list[dict] = []
        self.preset = tuple(loaded.messages)
        # The tokens of the last prompt plus its answer, and the text they spell: the next prompt extends them.
        self._tokens: list[int] = []
        self._text = ""
        self.set_system(system)

    # -- the conversation --------------------------------------------------------------------

    def _changed(self) -> None:
        self._forget_tokens()  # the engine keeps its cache: a prefix that still matches (the system prompt) is reused

    def replace(self, messages: list[dict]) -> None:
        self.messages = [dict(m) for m in messages]
        self._forget_tokens()

    def _forget_tokens(self) -> None:
        self._tokens, self._text = [], ""

    def reset_cache(self, seat=None) -> None:
        """After an interruption inside llama.cpp: start from an empty KV cache rather than a doubtful one."""
        if seat is None:
            with self.place.hold() as seat:
                seat.reset()
        else:
            seat.reset()
        self._forget_tokens()

    @property
    def kv_tokens(self) -> int:
        """Tokens in the KV cache now (of this conversation, where it is held)."""
        return self.place.held(self._tokens)

    @property
    def n_ctx(self) -> int:
        return self.place.n_ctx

    @property
    def model_path(self):
        return self.engine.path

    # What the chat REPL shows and starts from (RemoteConversation has the same, from the server).
    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def ref(self) -> str:
        return self.loaded.ref

    @property
    def sampling(self) -> SamplingOptions:
        return self.loaded.sampling

    @property
    def default_system(self) -> Optional[str]:
        return self.loaded.system

    def hold_session(self, name: str) -> None:
        """Hold session `name` for this chat from now on (SessionInUse when another chat has it)."""
        if self.claims is not None:
            self.claims.hold(name)

    # -- prompt --------------------------------------------------------------------------------

    def prompt(self, messages: list[dict], sampling: Optional[SamplingOptions] = None) -> Prompt:
        """The prompt for `messages` by the request path (runtime.request.prompt_for: the one renderer, drop-oldest
        policy and image markers), going on from the last prompt and its answer as they were evaluated (their own
        tokens: only the new part is tokenized, and the KV cache holds the rest). The oldest turns make room for
        the answer (Request.drop_oldest); a new message that leaves it no room alone is refused."""
        request = Request(messages=messages, sampling=sampling or self.sampling, drop_oldest=True,
                          extends=(self._tokens, self._text) if self._tokens else None)
        if any(m.get("images") for m in messages):
            self.projector(marked(messages)[1][0].name)
        n_ctx = self.n_ctx
        reserve = n_ctx - kept_room(n_ctx, request.sampling.max_tokens)
        try:
            prompt = prompt_for(self.engine, request, n_ctx=n_ctx)
            needed = len(prompt.tokens)
        except ContextOverflow as exc:  # over the whole context alone
            if not exc.n_prompt:
                raise
            prompt, needed = None, exc.n_prompt
        if prompt is None or needed + reserve > n_ctx:  # the new message alone leaves the answer too little room
            raise ContextOverflow(Phrase(
                "this message needs {needed} tokens with the conversation's template and {reserve} more are kept for"
                " the answer, but the context holds {n_ctx}: shorten it, or restart with a larger {ctx}",
                needed=needed, reserve=reserve, n_ctx=n_ctx))
        return prompt

    def projector(self, image: str) -> None:
        """Load the projector for the conversation's images (`image`: the first one's name, for the error that
        there is none): --mmproj, else as engine.vision's other users find one (runtime.images.projector_for)."""
        from .images import NoProjector, projector_for, use_projector

        engine = self.engine
        use_projector(engine, self.mmproj, self.name, self.ref)
        if projector_for(engine) is None:
            raise NoProjector(engine.path.name, image)

    def context_used(self) -> int:
        if not self.messages:
            return 0
        rendered, images = marked(self.messages)
        text = render(self.engine, rendered, add_generation_prompt=False).text
        if images and self.engine.vision is not None:
            return len(self.engine.vision.tokenize(text, images))
        return len(self.engine.tokenize(text, add_special=True, parse_special=True))

    # -- one exchange -----------------------------------------------------------------------------

    def send(
        self,
        text: str,
        sampling: SamplingOptions,
        on_piece: Callable[[str], None],
        cancelled: Callable[[], bool] = lambda: False,
        on_dropped: Callable[[int], None] = lambda n: None,
        save_as: Optional[str] = None,
        on_save_failed: Callable[[str], None] = lambda message: None,
        on_thinking: Callable[[str], None] = lambda text: None,
        images: Sequence[Image] = (),
        abandoned: Callable[[], bool] = lambda: False,
        on_progress: Callable[[Progress], None] = lambda progress: None,
    ) -> tuple[str, Response]:
        """Generate the answer to `text` (and `images`, which stay with it in the conversation), calling on_piece
        with each piece of it, and record the exchange. Returns the answer and the last response (finish reason
        'interrupted' once `cancelled` said so; an answer stopped before its first word is dropped together with
        its question). `on_dropped` hears how many old turns made room, first. `save_as`: then save the conversation as that session (a failure
        to save is reported to `on_save_failed`, the answer stands). A reasoning model's thinking goes to
        `on_thinking` and stays out of the conversation (its template leaves it out of earlier turns).
        `abandoned()` true once the answer was interrupted: whoever asked is gone (a chat's second Ctrl-C closed
        its connection to the server, and its REPL says the message was dropped), so the exchange is dropped as
        well, neither kept nor saved. `on_progress` hears how far a long prompt's evaluation is (engine.Progress), chunk
        by chunk, before the answer's first word."""
        if save_as:
            self.hold_session(save_as)  # before answering: refused, the question is not lost in an answer never saved
        asked = {"role": "user", "content": text, **({"images": list(images)} if images else {})}
        prompt = self.prompt([*self.messages, asked], sampling)
        if prompt.dropped:
            turns = _turns([*self.messages, asked], prompt.messages)
            self.messages = prompt.messages[:-1]
            self._forget_tokens()
            on_dropped(turns)
        with self.place.hold(prompt.tokens, cancelled=cancelled) as seat:
            return self._answer(seat, prompt, sampling, on_piece, cancelled, save_as, on_save_failed, on_thinking,
                                abandoned, on_progress)

    def _answer(self, seat, prompt: Prompt, sampling, on_piece, cancelled, save_as, on_save_failed, on_thinking,
                abandoned, on_progress) -> tuple[str, Response]:
        shown: list[str] = []
        ids: list[int] = []
        final = None
        thought = False
        responses = seat.generate(prompt.tokens, with_stops(sampling, prompt.stops), cancelled=cancelled,
                                  thinking=prompt.splitter(sampling))
        try:
            for response in responses:
                ids.extend(response.tokens)
                if response.progress is not None:
                    on_progress(response.progress)
                if response.thinking:
                    thought = True
                    on_thinking(response.thinking)
                if response.text:
                    shown.append(response.text)
                    on_piece(response.text)
                if response.done:
                    final = response
        except KeyboardInterrupt:  # a second Ctrl-C: llama.cpp may have been stopped mid-call
            responses.close()
            self.reset_cache(seat)
            raise
        except LocalrunError:
            self._forget_tokens()
            raise
        finally:
            responses.close()
        answer = "".join(shown)
        if final.finish_reason == "interrupted" and (not answer or abandoned()):
            self._forget_tokens()
            return answer, final
        if not ids or self.engine.detokenize(ids) != answer:  # cut by a stop sequence
            ids = self.engine.tokenize(answer, add_special=False, parse_special=True)
        content = answer if self.templated else answer.strip()
        self.messages = [*prompt.messages, {"role": "assistant", "content": content}]
        self._tokens, self._text = prompt.tokens + ids, prompt.text + answer
        if thought:  # the cache holds the thinking, the next prompt will not: it is made afresh (reusing what matches)
            self._forget_tokens()
        if save_as:
            try:
                self._save(seat, save_as)
            except LocalrunError as exc:
                on_save_failed(f"could not save session {save_as}: {exc.message}")
        return answer, final

    def save(self, name: str) -> str:
        """Save messages and KV cache in the session store; return a one-line description."""
        self.hold_session(name)
        with self.place.hold(self._tokens) as seat:
            return self._save(seat, name)

    def _save(self, seat, name: str) -> str:
        # What the seat holds beyond this conversation's tokens (a server slot another request used since) is
        # not saved with its messages.
        seat.keep(common_prefix(list(seat.tokens), self._tokens) if self._tokens else 0)
        with Sessions.open() as sessions:
            info = sessions.save(name, self.engine, stored(self.messages), model_ref=self.ref, seat=seat)
        return f"saved session {name} ({self.turns} turn(s), {info.tokens} tokens of KV cache)"

    def load(self, name: str) -> str:
        """Continue session `name`: its messages, and its KV cache restored into the engine."""
        self.hold_session(name)
        damaged: list[str] = []
        with Sessions.open() as sessions, self.place.hold() as seat:
            self.replace(live(sessions.load(name, self.engine, seat, on_notice=damaged.append)))
            held = 0 if damaged else len(seat.tokens)
        return "; ".join([*damaged, f"loaded session {name} ({self.turns} turn(s), {held} tokens cached)"])


def _turns(asked: list[dict], kept: list[dict]) -> int:
    """How many of the user's turns the messages `asked` lost to be `kept` (one at least: some were dropped)."""
    return max(sum(m["role"] == "user" for m in asked) - sum(m["role"] == "user" for m in kept), 1)
