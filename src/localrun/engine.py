"""Load a GGUF model into llama.cpp and decode: tokens in, typed events out.

Built on llama-cpp-python's low-level ctypes API and llama.cpp's C sampler chain, so no
per-token copy of the full-vocabulary logits ever happens in Python. The engine never prints.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

from .errors import ContextOverflow, EngineError, UsageError
from .sampling import SamplingOptions

FinishReason = Literal["stop", "eos", "length", "context", "interrupted"]
KV_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: Optional[int] = None
    gpu_layers: Union[int, Literal["auto"]] = 0
    flash_attn: Optional[bool] = None  # None = llama.cpp decides (auto)
    kv_type: str = "f16"
    swa_full: bool = True  # keep the whole cache for sliding-window layers: prefix reuse and session restore need it
    n_seq_max: int = 1
    # One KV pool for all sequences: beam search forks hypotheses cheaply there. The server keeps a stream
    # per sequence instead, so that a request's output does not depend on what else is in the batch.
    kv_unified: bool = False
    # An exact top-k in llama.cpp's graph before the C sampler chain (llama.cpp's backend sampling): the
    # chain then sees k candidates instead of the whole vocabulary, and the logits stay on the device.
    # None: on where the output layer runs on a GPU, or as LOCALRUN_BACKEND_SAMPLING (on/off) says. Off on
    # the CPU, where llama.cpp's sampling graph costs more than it saves (it copies the logits once more).
    backend_sampling: Optional[bool] = None
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise UsageError(f"invalid --kv-type {self.kv_type!r}: use one of {', '.join(KV_TYPES)}")
        if self.n_ctx < 16:
            raise UsageError(f"invalid --ctx {self.n_ctx}: the context must hold at least 16 tokens")
        if self.n_threads is not None and self.n_threads < 1:
            raise UsageError(f"invalid --threads {self.n_threads}: use 1 or more")
        if self.kv_type != "f16" and self.flash_attn is False:
            raise UsageError(
                f"--kv-type {self.kv_type} quantizes the V cache, which needs flash attention: drop --no-flash-attn"
            )


def parse_gpu_layers(value: str) -> Union[int, Literal["auto"]]:
    """--gpu-layers: a layer count, -1 or auto for all, 0 for CPU only."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < -1:
        raise UsageError(f"invalid --gpu-layers value {value!r}: use a number of layers, -1 or auto for all, 0 for CPU only")
    return n


@dataclass
class Token:
    """A piece of generated text (may be '' while a multi-byte character is incomplete)."""

    text: str
    token_id: int


@dataclass
class Stats:
    load_s: float = 0.0
    prompt_tokens: int = 0  # prompt tokens in the request
    cached_tokens: int = 0  # of those, reused from the KV cache (not evaluated)
    prompt_eval_s: float = 0.0
    eval_tokens: int = 0
    eval_s: float = 0.0
    ttft_s: float = 0.0
    finish_reason: FinishReason = "stop"
    target_steps: int = 0  # speculative decoding / beam search: batched decode calls of the target
    draft_tokens: int = 0  # speculative decoding: tokens proposed by the drafter
    draft_accepted: int = 0  # of those, tokens the target agreed with

    @property
    def prompt_eval_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def prompt_rate(self) -> float:
        return self.prompt_eval_tokens / self.prompt_eval_s if self.prompt_eval_s > 0 else 0.0

    @property
    def eval_rate(self) -> float:
        return self.eval_tokens / self.eval_s if self.eval_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        # Time per output token after the first one: decode cost as a user feels it.
        return self.eval_s / self.eval_tokens if self.eval_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "load_s": round(self.load_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_eval_tokens": self.prompt_eval_tokens,
            "prompt_eval_s": round(self.prompt_eval_s, 6),
            "prompt_tokens_per_s": round(self.prompt_rate, 3),
            "eval_tokens": self.eval_tokens,
            "eval_s": round(self.eval_s, 6),
            "eval_tokens_per_s": round(self.eval_rate, 3),
            "ttft_s": round(self.ttft_s, 6),
            "tpot_s": round(self.tpot_s, 6),
            "finish_reason": self.finish_reason,
            **({"target_steps": self.target_steps, "draft_tokens": self.draft_tokens, "draft_accepted": self.draft_accepted,
                "acceptance_rate": round(self.acceptance_rate, 4)} if self.target_steps else {}),
        }

    @property
    def acceptance_rate(self) -> float:
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class Done:
    stats: Stats
    tokens: list[int] = field(default_factory=list)


Event = Union[Token, Done]

_llama = None  # the llama_cpp module, imported on first use


def llama_cpp_module():
    """Import llama_cpp lazily (it loads a shared library) and silence its logging.

    Call it before anything imports numpy (the gguf package does) wherever a model is loaded. On a CUDA
    build made with some toolchains (seen on an H100 machine: CUDA 13, CXX=/opt/gcc/bin/g++),
    libggml-cuda.so exports its own copy of libstdc++'s locale symbols; when numpy has already loaded the
    system libstdc++, the tokenizer's std::regex segfaults inside llama_model_load_from_file.
    """
    global _llama
    if _llama is None:
        import llama_cpp

        global _log_callback
        show = bool(os.environ.get("LOCALRUN_LLAMA_LOG"))

        @llama_cpp.llama_log_callback
        def _log_callback(level, text, user_data):  # llama.cpp's chatter stays off the terminal unless asked for
            if _log_sink is not None:
                _log_sink.append(text.decode("utf-8", "replace"))
            if show:
                sys.stderr.write(text.decode("utf-8", "replace"))

        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _llama = llama_cpp
    return _llama


_log_callback = None  # kept referenced: llama.cpp holds the pointer
_log_sink: Optional[list] = None


@contextmanager
def captured_llama_log() -> Iterator[list]:
    """Collect llama.cpp's log lines (e.g. the buffer sizes it allocates) while the block runs."""
    global _log_sink
    llama_cpp_module()
    _log_sink = []
    try:
        yield _log_sink
    finally:
        _log_sink = None


@contextmanager
def deferred_interrupt() -> Iterator[list]:
    """Hold Ctrl-C while llama.cpp calls back into Python, and raise it once llama.cpp has returned.

    A KeyboardInterrupt raised inside a ctypes callback (the log callback above, which model load calls
    hundreds of times) is swallowed by ctypes: it printed "Exception ignored on calling ctypes callback"
    and the command carried on, 9 times in 30 Ctrl-Cs during `localrun run`'s load. Here SIGINT only
    records itself (the returned list fills); load_model's progress callback then stops the load, and
    KeyboardInterrupt is raised at the end of the block. Only where Python's own handler is in place on
    the main thread (not under uvicorn, which handles signals itself).
    """
    import signal
    import threading

    hit: list = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield hit
        return
    signal.signal(signal.SIGINT, lambda *_: hit.append(True))
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hit:
        raise KeyboardInterrupt


def system_info() -> dict:
    ll = llama_cpp_module()
    return {
        "llama_cpp_python": ll.__version__,
        "system_info": ll.llama_print_system_info().decode("utf-8", "replace").strip(),
        "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        "mmap": bool(ll.llama_supports_mmap()),
    }


def build_id() -> str:
    """Identifies the llama.cpp build that made a saved KV state (states are not portable across builds)."""
    ll = llama_cpp_module()
    return f"llama-cpp-python {ll.__version__}"


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


_GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
# The backend-sampling prefilter keeps this many candidates (more where a chain needs more): wider than
# llama.cpp's default top-k of 40, so that common settings never re-attach it.
PREFILTER_K = 128


def _token_piece(vocab, token: int, buf, special: bool):
    """A token's bytes, and the buffer to use next time (a larger one when the piece did not fit)."""
    ll = llama_cpp_module()
    n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n], buf


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two token lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Engine:
    """One model, one context. Tracks which tokens sit in the KV cache of sequence 0 so that a
    prompt sharing a prefix with the previous one only evaluates the new tokens."""

    def __init__(self, model_path: Path | str, options: LoadOptions = LoadOptions()):
        ll = llama_cpp_module()  # before gguf_info, whose gguf imports numpy: see llama_cpp_module()
        from .gguf_info import read_info

        self.path = Path(model_path)
        self.info = read_info(self.path)  # refuses non-GGUF, truncated, unknown arch before llama.cpp sees it
        self.options = options
        self.gpu_notice: Optional[str] = None
        t0 = time.perf_counter()

        mparams = ll.llama_model_default_params()
        gpu_layers = options.gpu_layers
        if gpu_layers == "auto":
            gpu_layers = -1 if ll.llama_supports_gpu_offload() else 0
        elif gpu_layers and not ll.llama_supports_gpu_offload():
            self.gpu_notice = (
                "this llama.cpp build has no GPU backend; running on the CPU "
                "(rebuild with scripts/build_llama_cpp.sh cuda|metal for offload)"
            )
            gpu_layers = 0
        mparams.n_gpu_layers = self.gpu_layers = int(gpu_layers)  # -1: all
        self.backend_sampling = self._resolve_backend_sampling(ll, options)
        self._prefilter, self._prefilter_k = None, 0  # the top-k chain attached to sequence 0, and its k
        self.ctx = None
        with deferred_interrupt() as interrupted:  # Ctrl-C here: freed below, KeyboardInterrupt on leaving
            keep_going = ll.llama_progress_callback(lambda progress, user_data: not interrupted)  # False stops the load
            mparams.progress_callback = keep_going
            self.model = ll.llama_model_load_from_file(str(self.path).encode(), mparams)
            if self.model and not interrupted:
                self._init_context(ll, options)
            if interrupted:
                self.close()
        if not self.model:
            raise EngineError(f"llama.cpp could not load {self.path}: check the file with `localrun show`")
        if not self.ctx:
            self.use_raw_logits()
            ll.llama_model_free(self.model)
            self.model = None
            raise EngineError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens"
                f" (kv {options.kv_type}): try a smaller --ctx"
            )
        self.memory = ll.llama_get_memory(self.ctx)
        # llama.cpp rounds the context up (to 256); the limit the user asked for is the one we honour.
        self.n_ctx = min(options.n_ctx, ll.llama_n_ctx(self.ctx))
        self.n_batch = options.n_batch
        self.load_s = time.perf_counter() - t0
        self.cached: list[int] = []  # tokens whose KV is in sequence 0, in order
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog: Optional[list[int]] = None
        self._one = (ll.llama_token * 1)()
        self.strategy = None  # decoding.Speculative or decoding.BeamSearch: generate() delegates to it

    def _init_context(self, ll, options: LoadOptions) -> None:
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

        cparams = ll.llama_context_default_params()
        cparams.n_ctx = options.n_ctx
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = min(options.n_ubatch, options.n_batch)
        cparams.n_seq_max = options.n_seq_max
        threads = options.n_threads or default_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.type_k = _GGML_TYPES[options.kv_type]
        cparams.type_v = _GGML_TYPES[options.kv_type]
        cparams.swa_full = options.swa_full
        cparams.kv_unified = options.kv_unified
        cparams.no_perf = True
        if options.flash_attn is None:
            # A quantized V cache needs flash attention; otherwise let llama.cpp pick.
            cparams.flash_attn_type = 1 if options.kv_type != "f16" else -1
        else:
            cparams.flash_attn_type = 1 if options.flash_attn else 0
        if self.backend_sampling:
            # Attached from the start, so that llama.cpp sizes its graphs for it while loading, not
            # while the first prompt waits (a later attach costs a graph reservation: ~6 ms on an H100).
            chain = self._prefilter_chain(PREFILTER_K)
            config = ll.llama_sampler_seq_config(0, ctypes.cast(chain, ctypes.c_void_p))
            cparams.samplers, cparams.n_samplers = ctypes.pointer(config), 1
            self._prefilter, self._prefilter_k = chain, PREFILTER_K
        self.ctx = ll.llama_init_from_model(self.model, cparams)

    def _resolve_backend_sampling(self, ll, options: LoadOptions) -> bool:
        if options.n_seq_max > 1:
            return False  # the server and beam search sample many sequences from raw logits
        if options.backend_sampling is not None:
            return options.backend_sampling
        env = os.environ.get("LOCALRUN_BACKEND_SAMPLING", "auto").lower()
        if env in ("on", "1", "true"):
            return True
        if env in ("off", "0", "false"):
            return False
        # auto: where the output layer (offloaded last) sits on a GPU
        return bool(ll.llama_supports_gpu_offload()) and (self.gpu_layers < 0 or self.gpu_layers > self.info.n_layer)

    def _prefilter_chain(self, k: int):
        ll = llama_cpp_module()
        params = ll.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = ll.llama_sampler_chain_init(params)
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(k))
        return chain

    def _prefilter_for(self, k: Optional[int]) -> bool:
        """Make sequence 0 carry an exact top-k of at least k in llama.cpp's graph (backend sampling), or
        none (k None: the chain needs raw logits). With it, llama_sampler_sample gives the C chain those
        candidates, and the logits are never copied off the device. It stays attached between
        generations; any top-k at least as wide as the chain's own first cut picks the same tokens."""
        if k is not None and self._prefilter is not None and k <= self._prefilter_k:
            return True
        self.use_raw_logits()
        if k is None or not self.backend_sampling:
            return False
        ll = llama_cpp_module()
        k = max(k, PREFILTER_K)
        chain = self._prefilter_chain(k)
        with deferred_interrupt():  # llama.cpp logs here: a Ctrl-C is raised once self._prefilter is set
            if ll.llama_set_sampler(self.ctx, 0, chain):
                self._prefilter, self._prefilter_k = chain, k
            else:
                ll.llama_sampler_free(chain)
        return self._prefilter is not None

    def use_raw_logits(self) -> None:
        """For whatever reads the logits itself (the server's scheduler, speculative decoding, beam search,
        perplexity): no prefilter on sequence 0 from here on, until a plain generate() attaches one again."""
        chain, self._prefilter = self._prefilter, None
        if chain is None:
            return
        ll = llama_cpp_module()
        with deferred_interrupt():
            if self.ctx:
                ll.llama_set_sampler(self.ctx, 0, None)
            ll.llama_sampler_free(chain)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        ll = _llama
        if ll is None:
            return
        with deferred_interrupt():  # llama.cpp logs while it frees: see deferred_interrupt()
            if getattr(self, "strategy", None) is not None:
                self.strategy.close()
                self.strategy = None
            if getattr(self, "_prefilter", None) is not None:
                self.use_raw_logits()
            if getattr(self, "ctx", None):
                ll.llama_free(self.ctx)
                self.ctx = None
            if getattr(self, "model", None):
                ll.llama_model_free(self.model)
                self.model = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except (Exception, KeyboardInterrupt):  # a finalizer cannot pass an exception on (Python would print it)
            pass

    # -- text <-> tokens -------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ll = llama_cpp_module()
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        piece, self._piece_buf = _token_piece(self.vocab, token, self._piece_buf, special)
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        # Its own buffer, not token_bytes' shared one: the server calls this outside the decode thread.
        buf, out = ctypes.create_string_buffer(256), []
        for t in tokens:
            piece, buf = _token_piece(self.vocab, t, buf, False)
            out.append(piece)
        return b"".join(out).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp_module().llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> list[int]:
        if self._eog is None:  # a walk over the whole vocabulary (262k for gemma): once per model
            ll = llama_cpp_module()
            self._eog = [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]
        return self._eog

    # -- chat template ---------------------------------------------------------------------

    @property
    def chat_template(self) -> Optional[str]:
        return self.info.chat_template

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's own template (llama.cpp's built-in renderer; Jinja as fallback)."""
        template = self.chat_template
        if template is None:
            raise EngineError("this model has no chat template: use --raw for plain completion")
        ll = llama_cpp_module()
        arr = (ll.llama_chat_message * len(messages))()
        keep = []  # the encoded strings must outlive the call
        for i, m in enumerate(messages):
            role, content = m["role"].encode(), m["content"].encode("utf-8")
            keep += [role, content]
            arr[i].role, arr[i].content = role, content
        tmpl = template.encode("utf-8")
        size = sum(len(k) for k in keep) * 2 + 1024
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, arr, len(messages), add_generation_prompt, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = ll.llama_chat_apply_template(tmpl, arr, len(messages), add_generation_prompt, buf, n)
        if n >= 0:
            return buf.raw[:n].decode("utf-8")
        return self._apply_jinja(messages, add_generation_prompt)

    def _apply_jinja(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = self.detokenize([self.info.bos_token_id]) if self.info.bos_token_id is not None else ""
        eos = self.detokenize([self.info.eos_token_id]) if self.info.eos_token_id is not None else ""
        fmt = Jinja2ChatFormatter(
            template=self.chat_template, bos_token=bos, eos_token=eos, add_generation_prompt=add_generation_prompt
        )
        return fmt(messages=list(messages)).prompt

    # -- decoding --------------------------------------------------------------------------

    def _decode(self, tokens: Sequence[int]) -> None:
        ll = llama_cpp_module()
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            arr = (ll.llama_token * len(chunk))(*chunk)
            rc = ll.llama_decode(self.ctx, ll.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                self._forget_after(len(self.cached))
                raise EngineError(f"llama.cpp decode failed (code {rc}) after {len(self.cached)} tokens: try a smaller --ctx or --batch")
            self.cached.extend(chunk)

    def _forget_after(self, n_keep: int) -> bool:
        """Drop KV entries from position n_keep on. False if the memory cannot do a partial removal."""
        ll = llama_cpp_module()
        ok = bool(ll.llama_memory_seq_rm(self.memory, 0, n_keep, -1))
        if ok:
            del self.cached[n_keep:]
        else:
            ll.llama_memory_clear(self.memory, True)
            self.cached.clear()
        return ok

    def reset(self) -> None:
        llama_cpp_module().llama_memory_clear(self.memory, True)
        self.cached.clear()

    def prefill(self, tokens: Sequence[int]) -> int:
        """Make the KV cache hold exactly `tokens`, reusing the longest cached prefix, and leave the
        logits of the last token ready to sample from. Returns how many tokens were reused."""
        common = min(common_prefix(self.cached, tokens), len(tokens) - 1)  # the last token is always evaluated: its logits are needed
        if common < len(self.cached) and not self._forget_after(common):
            common = 0
        self._decode(tokens[common:])
        return common

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self.n_ctx:
            raise ContextOverflow(
                f"the prompt is {n_prompt} tokens but the context holds {self.n_ctx}: "
                f"raise --ctx (up to the model's {self.info.context_length}) or pass --truncate to keep its end"
            )

    def generate(self, prompt: Sequence[int], sampling: SamplingOptions) -> Iterator[Event]:
        """Stream tokens for `prompt` (token ids). The last event is Done with stats.

        With a strategy set (speculative decoding, beam search; see decoding.py) it decodes instead.

        Stops at end-of-generation (EOS), max_tokens or a full context (finish reason 'length').
        Stop sequences on text are the caller's business (see stops.StopMatcher), so it can cut
        mid-token and report 'stop'.
        """
        if self.strategy is not None:
            self.use_raw_logits()
            return self.strategy.generate(self, prompt, sampling)
        return self._generate(prompt, sampling)

    def begin(self, prompt: Sequence[int], sampling: SamplingOptions):
        """What every decoding path starts with: checks, fresh stats, the sampler chain, a UTF-8 decoder."""
        from .sampling import make_sampler

        if not prompt:
            raise UsageError("empty prompt: give some text as an argument or on stdin")
        self.check_fits(len(prompt))
        stats = Stats(load_s=self.load_s, prompt_tokens=len(prompt))
        return stats, make_sampler(self, sampling), codecs.getincrementaldecoder("utf-8")(errors="replace")

    def end(self, stats: Stats, t0: float, t_first: Optional[float], n_generated: int) -> None:
        """What every decoding path ends with: timings filled in (also after an interruption), kept as last_stats."""
        t_end = time.perf_counter()
        if t_first is None:
            t_first = t_end
            stats.prompt_eval_s = t_end - t0
        stats.ttft_s = t_first - t0
        stats.eval_tokens = max(0, n_generated - 1)
        stats.eval_s = t_end - t_first if n_generated > 1 else 0.0
        self.last_stats = stats

    def _generate(self, prompt: Sequence[int], sampling: SamplingOptions) -> Iterator[Event]:
        ll = llama_cpp_module()
        stats, sampler, decoder = self.begin(prompt, sampling)
        generated: list[int] = []
        t0 = time.perf_counter()
        t_first = None
        try:
            prefiltered = self._prefilter_for(sampler.prefilter)
            stats.cached_tokens = self.prefill(prompt)
            if prefiltered and not ll.llama_get_sampled_candidates_ith(self.ctx, -1):
                # The device could not run the top-k (llama.cpp left the whole vocabulary, without ids, for
                # the chain to read): sample on the CPU as usual, from the last token evaluated once more.
                self.use_raw_logits()
                self.backend_sampling = False  # for good: the next generation would only fall back again
                self._forget_after(len(self.cached) - 1)
                self.prefill(prompt)
            sampler.accept_prompt(prompt)
            limit = sampling.max_tokens if sampling.max_tokens > 0 else 1 << 62
            # The hot loop: locals only, one reusable 1-token batch over a fixed array.
            one = self._one
            step = ll.llama_batch_get_one(one, 1)
            decode, is_eog, sample = ll.llama_decode, ll.llama_vocab_is_eog, sampler.sample
            ctx, vocab, cached, n_ctx = self.ctx, self.vocab, self.cached, self.n_ctx
            piece, utf8 = self.token_bytes, decoder.decode
            while True:
                tok = sample(ctx, len(generated))
                if t_first is None:
                    t_first = time.perf_counter()
                    stats.prompt_eval_s = t_first - t0
                if is_eog(vocab, tok):
                    stats.finish_reason = "eos"
                    break
                generated.append(tok)
                yield Token(utf8(piece(tok)), tok)
                if len(generated) >= limit or len(cached) >= n_ctx:
                    stats.finish_reason = "length"  # max tokens, or the context is full: said, never silent
                    break
                one[0] = tok
                if decode(ctx, step) != 0:
                    raise EngineError(f"llama.cpp decode failed at position {len(cached)}: try a smaller --ctx")
                cached.append(tok)
            tail = decoder.decode(b"", final=True)
            if tail:
                yield Token(tail, -1)
        except GeneratorExit:
            # The consumer stopped early (a stop sequence, a closed pipe): that is a normal end.
            raise
        except KeyboardInterrupt:
            stats.finish_reason = "interrupted"
            raise
        finally:
            self.end(stats, t0, t_first, len(generated))
            sampler.close()
        yield Done(stats, generated)
