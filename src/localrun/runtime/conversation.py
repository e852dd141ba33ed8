"""A multi-turn conversation with one loaded model, its KV cache reused from turn to turn.

Each turn's prompt is the previous turn's tokens (prompt, then the answer exactly as it was generated)
followed by the tokens of what the template adds after them (the end of the answer, the new message, the
assistant header), as llama.cpp's own llama-cli does (engine.kv.extend_tokens). So only those new tokens
are evaluated. If the template renders the history differently from the last prompt (or after a load, a
new system prompt), the whole conversation is tokenised again and the engine still reuses whatever prefix
matches. When the conversation no longer fits the context, the oldest turns after the system prompt are
dropped, down to half the context so that it does not happen again on the next turn.

A user message may carry images ("images": engine.vision.Image, placed before its text as `run --image` places
them): they stay in the conversation, so every later prompt holds them too, as negative ids keyed by the
sha256 of their bytes (engine.vision), and the KV they were evaluated into is reused like text's, not encoded
again. A session keeps them inside its messages (each as its sha256, name and bytes in base64: `stored`), so
a resumed session's prompt, and its answers, are the same.

A conversation answered in this process is this process's chat: it holds the writer lock of every session it
opens, loads or saves until it ends (store.writers), so no other chat or run can write them meanwhile. One the
background server keeps for a chat client (`place` given) takes none: its client holds them (runtime.remote).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..engine import Response, SamplingOptions
from ..engine.types import Progress
from ..engine.kv import common_prefix, extend_tokens
from ..engine.prompt import TRANSCRIPT_STOP, render
from ..engine.thinking import splitter_for, thinking_in
from ..engine.vision import MARKER, Image
from ..errors import ContextOverflow, LocalrunError, UsageError
from ..store.writers import SessionClaims
from .loader import Loaded
from .messages import Messages
from .request import marked, with_stops
from .images import images_in, live, live_images, stored, stored_images  # noqa: F401 - (their old home)
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

    def prompt(self, messages: list[dict]) -> tuple[list[int], str]:
        """The prompt tokens for `messages` and the text they spell (an image as its MARKER)."""
        rendered, images = marked(messages)
        full = render(self.engine, rendered).text
        if not images:
            return extend_tokens(self._tokens, self._text, full, self.engine.tokenize), full
        self.projector(images[0].name)
        if self._tokens and full.startswith(self._text):  # only the new part: its images are the last ones
            new = images[self._text.count(MARKER):]
            return [*self._tokens, *self._tokenize(full[len(self._text):], new, start=False)], full
        return self._tokenize(full, images, start=True), full

    def _tokenize(self, text: str, images: Sequence[Image], *, start: bool) -> list[int]:
        """`text` with one MARKER per image: as engine.vision tokenizes a whole prompt (`start`), or else as the
        continuation of one (no BOS, each piece of text tokenized as extend_tokens tokenizes it)."""
        vision, engine = self.engine.vision, self.engine
        if start:
            return vision.tokenize(text, images)
        pieces = text.split(MARKER)
        if len(pieces) - 1 != len(images):
            raise UsageError(f"the conversation has {len(pieces) - 1} image markers ({MARKER}) for {len(images)} images:"
                             f" leave {MARKER} out of the text")
        tokens = engine.tokenize(pieces[0], add_special=False, parse_special=True)
        for image, piece in zip(images, pieces[1:]):
            tokens.extend(vision.image_tokens(image))
            if piece:
                tokens.extend(engine.tokenize(piece, add_special=False, parse_special=True))
        return tokens

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
            return len(self._tokenize(text, images, start=True))
        return len(self.engine.tokenize(text, add_special=True, parse_special=True))

    def fit(self, messages: list[dict], reserve: int) -> tuple[list[dict], list[int], str, int]:
        """Drop the oldest turns (after the system prompt) until the prompt leaves `reserve` tokens for
        the answer; once dropping, go on down to half the context so the next turn does not drop again."""
        n_ctx = self.n_ctx
        tokens, full = self.prompt(messages)
        dropped = 0
        while len(tokens) + reserve > n_ctx or (dropped and len(tokens) > (n_ctx - reserve) // 2):
            first = next(i for i, m in enumerate(messages) if m["role"] != "system")
            if first >= len(messages) - 1:  # only the new message is left
                if len(tokens) + reserve <= n_ctx:
                    break
                raise ContextOverflow(
                    f"this message needs {len(tokens)} tokens with the conversation's template and"
                    f" {reserve} more are kept for the answer, but the context holds {n_ctx}:"
                    " shorten it, or restart with a larger --ctx"
                )
            end = first + 1
            while end < len(messages) - 1 and messages[end]["role"] != "user":
                end += 1
            messages = messages[:first] + messages[end:]
            dropped += 1
            tokens, full = self.prompt(messages)
        return messages, tokens, full, dropped

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
        sampling = with_stops(sampling, [] if self.templated else [TRANSCRIPT_STOP])
        reserve = sampling.max_tokens if sampling.max_tokens > 0 else self.n_ctx // 4
        reserve = min(reserve, self.n_ctx // 2)
        asked = {"role": "user", "content": text, **({"images": list(images)} if images else {})}
        messages, tokens, full, dropped = self.fit([*self.messages, asked], reserve)
        if dropped:
            self.messages = messages[:-1]
            self._forget_tokens()
            on_dropped(dropped)
        with self.place.hold(tokens, cancelled=cancelled) as seat:
            return self._answer(seat, messages, tokens, full, sampling, on_piece, cancelled, save_as, on_save_failed,
                                on_thinking, abandoned, on_progress)

    def _answer(self, seat, messages, tokens, full, sampling, on_piece, cancelled, save_as, on_save_failed,
                on_thinking, abandoned, on_progress) -> tuple[str, Response]:
        shown: list[str] = []
        ids: list[int] = []
        final = None
        splitter = splitter_for(thinking_in(self.engine.chat_template, full), sampling)
        thought = False
        responses = seat.generate(tokens, sampling, cancelled=cancelled, thinking=splitter)
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
        self.messages = [*messages, {"role": "assistant", "content": content}]
        self._tokens, self._text = tokens + ids, full + answer
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

