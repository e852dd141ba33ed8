"""One GGUF model loaded into llama.cpp with one context: load options, the tokenizer, the KV cache, and the
one call that decodes a batch. Built on llama-cpp-python's low-level ctypes API. The engine never prints."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

from ..errors import ContextOverflow, EngineError, Phrase, SettingError, UsageError
from .footprint import mapped_regions, release_repacked_pages, repacked_spans, repacks_here, shard_headers
from .kv import KVCache
from .llama import deferred_interrupt, default_threads, llama_cpp_module, load_progress, loaded
from .options import KV_TYPES, check_context

POOLING = {"mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama_pooling_type (rank: a reranker's score, engine.Engine.rank)
_GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
# The backend-sampling prefilter keeps this many candidates (more where a chain needs more): wider than
# llama.cpp's default top-k of 40, so that common settings never re-attach it.
PREFILTER_K = 128


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
    # The most rows one batch asks logits for (0: n_batch, llama.cpp's default). llama.cpp reserves the
    # output layer's compute buffer for that many rows of the vocabulary: 512 MiB for gemma-3's 262k at 512.
    # Sampling asks for one row per sequence per step; perplexity and embeddings need every row.
    n_outputs: int = 0
    # One KV pool for sequences that fork (beam search's hypotheses share their cells) or come and go together
    # (an embeddings batch's texts).
    kv_unified: bool = False
    # A server's slots in one KV pool of n_ctx cells (llama.cpp's unified KV, as llama-server keeps its slots by
    # default; runtime.options.LoadSpec.shares_kv): each fills what its request needs, up to all of it, where a
    # stream per slot holds n_ctx / n_seq_max cells, allocated (and resident) whether used or not.
    shared_kv: bool = False
    # An exact top-k in llama.cpp's graph before the C sampler chain (llama.cpp's backend sampling): the
    # chain then sees k candidates instead of the whole vocabulary, and the logits stay on the device.
    # None: on where the output layer runs on a GPU, or as LOCALRUN_BACKEND_SAMPLING (on/off) says. Off on
    # the CPU, where llama.cpp's sampling graph costs more than it saves (it copies the logits once more).
    backend_sampling: Optional[bool] = None
    # An embeddings context (Engine.embed): pooled vectors per sequence instead of logits to sample from.
    embeddings: bool = False
    pooling: Optional[str] = None  # mean, cls, last or rank; None: the model's own (GGUF), else mean
    # llama.cpp RPC workers (engine.rpc) whose devices take layers as GPUs would, before local GPUs; and the
    # proportions per device (RPC workers, then GPUs) instead of llama.cpp's split by free memory.
    rpc: tuple[str, ...] = ()
    tensor_split: Optional[tuple[float, ...]] = None
    # LoRA adapters (engine.lora): (file, scale) each, loaded with the model and applied at these scales until
    # a request asks for others (Engine.use_lora).
    lora: tuple[tuple[str, float], ...] = ()
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise SettingError("kv_type", self.kv_type, f"use one of {', '.join(KV_TYPES)}")
        check_context(self.n_ctx)
        if self.n_threads is not None and self.n_threads < 1:
            raise SettingError("threads", self.n_threads, "use 1 or more")
        most = max(64, 4 * (os.cpu_count() or 1))  # llama.cpp starts that many threads: 10,000 would stall it
        if self.n_threads is not None and self.n_threads > most:
            raise SettingError("threads", self.n_threads, f"this machine has {os.cpu_count()} CPUs (at most {most})")
        if self.pooling is not None and self.pooling not in POOLING:
            raise SettingError("pooling", self.pooling, f"use one of {', '.join(POOLING)}")
        if self.kv_type != "f16" and self.flash_attn is False:
            raise SettingError("kv_type", self.kv_type, "it quantizes the V cache, which needs flash attention (leave it on or auto)")


def pooling_for(info, asked: Optional[str]) -> str:
    """The pooling of an embeddings context: the one asked for, else the model's own (GGUF
    `ARCH.pooling_type`: an embedding model says), else mean (a chat model's hidden states averaged)."""
    if asked is not None:
        return asked
    own = info.metadata.get(f"{info.architecture}.pooling_type")
    names = {v: k for k, v in POOLING.items()}
    return names.get(own, "mean")


def parse_gpu_layers(value: str) -> Union[int, Literal["auto"]]:
    """--gpu-layers: a layer count, -1 or auto for all, 0 for CPU only."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < -1:
        raise SettingError("gpu_layers", value, "use a number of layers, -1 or auto for all, 0 for CPU only")
    return n


def _token_piece(vocab, token: int, buf, special: bool):
    """A token's bytes, and the buffer to use next time (a larger one when the piece did not fit)."""
    ll = llama_cpp_module()
    n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n], buf


class DecodeError(EngineError):
    """llama.cpp refused a batch (code `rc`): the KV cache is not changed by it."""

    def __init__(self, message: "str | Phrase", rc: int):
        super().__init__(message)
        self.rc = rc


class Batch:
    """A llama.cpp batch of up to `capacity` tokens, refilled for every step (engine.step)."""

    def __init__(self, capacity: int):
        self._ll = llama_cpp_module()
        self.capacity = capacity
        self.raw = self._ll.llama_batch_init(capacity, 0, 1)
        raw = self.raw  # the arrays, looked up once: add() runs for every token
        self._token, self._pos, self._n_seq_id, self._seq_id, self._logits = raw.token, raw.pos, raw.n_seq_id, raw.seq_id, raw.logits
        self.n = 0
        self.outputs = 0  # rows whose logits are asked for
        self._ones = (ctypes.c_int32 * capacity)(*([1] * capacity))
        self.seqs: list[int] = []  # the sequence of each row, to keep the KV token lists in step
        self.tokens: list[int] = []

    def clear(self) -> None:
        self.n = 0
        self.outputs = 0
        self.seqs.clear()
        self.tokens.clear()

    def room(self) -> int:
        return self.capacity - self.n

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        """Put a token at `pos` of sequence `seq`; `output` asks for its logits. Returns its row."""
        i = self.n
        self._token[i] = token
        self._pos[i] = pos
        self._n_seq_id[i] = 1
        self._seq_id[i][0] = seq
        self._logits[i] = output
        self.outputs += output
        self.seqs.append(seq)
        self.tokens.append(token)
        self.n = i + 1
        return i

    def add_span(self, tokens: Sequence[int], pos0: int, seq: int) -> None:
        """Put consecutive tokens of one sequence at pos0, pos0+1, ... without outputs (a prompt chunk):
        whole arrays copied at once, for a chunk of 512 costs as much Python as a few single tokens."""
        b, i, n = self.raw, self.n, len(tokens)
        if n == 0:
            return
        i32 = ctypes.c_int32 * n
        ctypes.memmove(ctypes.cast(b.token, ctypes.c_void_p).value + 4 * i, i32(*tokens), 4 * n)
        ctypes.memmove(ctypes.cast(b.pos, ctypes.c_void_p).value + 4 * i, i32(*range(pos0, pos0 + n)), 4 * n)
        ctypes.memmove(ctypes.cast(b.n_seq_id, ctypes.c_void_p).value + 4 * i, self._ones, 4 * n)
        ctypes.memset(ctypes.cast(b.logits, ctypes.c_void_p).value + i, 0, n)
        seq_id = b.seq_id
        for row in range(i, i + n):
            seq_id[row][0] = seq
        self.seqs.extend([seq] * n)
        self.tokens.extend(tokens)
        self.n = i + n

    def want_output(self, row: int) -> None:
        self.outputs += not self._logits[row]
        self._logits[row] = 1

    def close(self) -> None:
        if self.raw is not None:
            self._ll.llama_batch_free(self.raw)
            self.raw = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Engine:
    """One model, one context. `kv` tracks which tokens each sequence holds, so that a prompt sharing a
    prefix with what a sequence holds only evaluates the new tokens."""

    def __init__(self, model_path: Path | str, options: LoadOptions = LoadOptions()):
        ll = llama_cpp_module()  # before gguf_info, whose gguf imports numpy: see llama_cpp_module()
        from .gguf_info import read_info

        self._ll = ll
        self.path = Path(model_path)
        self.info = read_info(self.path)  # refuses non-GGUF, truncated, unknown arch before llama.cpp sees it
        self.options = options
        self.gpu_notice: Optional[str] = None
        self.n_threads = options.n_threads or default_threads()  # llama.cpp's CPU threads (_init_context sets them)
        self.template_override: Optional[str] = None  # a chat template given for the model (a Modelfile's TEMPLATE)
        t0 = time.perf_counter()

        mparams = ll.llama_model_default_params()
        self._place(mparams, options)
        gpu_layers = options.gpu_layers
        if gpu_layers == "auto":
            gpu_layers = -1 if self.devices else 0
        elif gpu_layers and not self.devices:
            self.gpu_notice = (
                "this llama.cpp build has no GPU backend; running on the CPU "
                "(rebuild with scripts/build_llama_cpp.sh cuda|metal for offload)"
            )
            gpu_layers = 0
        mparams.n_gpu_layers = self.gpu_layers = int(gpu_layers)  # -1: all
        self.backend_sampling = self._resolve_backend_sampling(ll, options) and not options.embeddings
        self.pooling = pooling_for(self.info, options.pooling) if options.embeddings else None
        self._prefilters: dict[int, tuple[object, int]] = {}  # sequence id -> the top-k chain attached to it, its k
        self._rows: dict[int, object] = {}  # logits()' one-row numpy views, by address
        self.ctx = None
        self._batch: Optional[Batch] = None
        self.vision = None  # an engine.vision.Projector once load_projector is called: prompts may hold images
        repack = repacks_here(bool(options.rpc))
        files = [p for p, _ in shard_headers(self.path)] if repack else []
        mapped_before = mapped_regions(files) if repack else set()
        report = load_progress.get()  # (a server's pool: `ps` shows the load's progress)
        with deferred_interrupt() as interrupted:  # Ctrl-C here: freed below, KeyboardInterrupt on leaving
            def progress(fraction: float, user_data) -> bool:
                if report is not None:
                    try:
                        report(fraction)
                    except Exception:  # noqa: BLE001 - nothing may leave a llama.cpp callback
                        pass
                return not interrupted  # False stops the load

            keep_going = ll.llama_progress_callback(progress)
            mparams.progress_callback = keep_going
            self.model = ll.llama_model_load_from_file(str(self.path).encode(), mparams)
            if self.model and not interrupted:
                self._init_context(ll, options)
            if interrupted:
                self.close()
        # The file's pages of the weights llama.cpp repacked, read once to make the copy: given back (see
        # engine.footprint), so the process holds those weights once.
        self.released_bytes = release_repacked_pages(repacked_spans(self.path), mapped_regions(files) - mapped_before) if (
            repack and self.model) else 0
        if not self.model:
            self._release_workers()
            raise EngineError(f"llama.cpp could not load {self.path}: check the file with `localrun show`")
        if not self.ctx:
            self.use_raw_logits()
            ll.llama_model_free(self.model)
            self.model = None
            raise EngineError(Phrase(
                "llama.cpp could not create a context of {n_ctx} tokens (kv {kv}): try a smaller {ctx}",
                n_ctx=options.n_ctx, kv=options.kv_type)
            )
        self.kv = KVCache(self.ctx, options.n_seq_max, self.info.sliding_window if any(self.info.swa_layers or [True]) else None,
                          unified=options.kv_unified or options.shared_kv)
        self.adapters: tuple = ()  # llama.cpp's handles of the LoRA adapters, in the order of options.lora
        self.lora: tuple[float, ...] = ()  # the scales applied to the context now, one per adapter
        # The scales a request is answered under when it names none: the load's, until changed (llama-server's
        # POST /lora-adapters: runtime.lora.set_default_scales).
        self.lora_defaults: tuple[float, ...] = ()
        if options.lora:
            self._load_adapters(ll, options.lora)
        # llama.cpp rounds the context up (to 256); the limit the user asked for is the one we honour.
        self.n_ctx = min(options.n_ctx, ll.llama_n_ctx(self.ctx))
        self.n_batch = options.n_batch
        self.load_s = time.perf_counter() - t0
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog: Optional[list[int]] = None

    def _load_adapters(self, ll, adapters: tuple[tuple[str, float], ...]) -> None:
        """Load the LoRA adapters into the model and apply them at their scales. A file llama.cpp refuses (checked
        before: engine.lora.check_adapter) closes the engine and raises with llama.cpp's reason."""
        from .llama import captured_llama_log
        from .lora import AdapterError

        handles = []
        for path, _ in adapters:
            with captured_llama_log() as log, deferred_interrupt():
                handle = ll.llama_adapter_lora_init(self.model, str(path).encode())
            if not handle:
                reason = next((line.split("failed to apply lora adapter: ", 1)[1].strip() for line in log
                               if "failed to apply lora adapter: " in line), "llama.cpp could not load it")
                self.close()
                raise AdapterError(path, reason)
            handles.append(handle)
        self.adapters = tuple(handles)
        self.lora_defaults = tuple(float(scale) for _, scale in adapters)
        self.use_lora(self.lora_defaults)

    def use_lora(self, scales: Sequence[float]) -> None:
        """Apply the adapters at `scales` (one per adapter, in load order; 0 leaves one out) to what the context
        decodes from now on. One set for a whole batch: llama.cpp applies adapters per context. The KV a sequence
        holds keeps the scales it was made under (engine.kv: KVCache.made_with), and is reused only under the same."""
        from .lora import lora_key

        scales = tuple(float(s) for s in scales)
        if len(scales) != len(self.adapters):
            raise EngineError(f"{len(scales)} LoRA scales for {len(self.adapters)} adapters")
        if scales == self.lora:
            return
        ll = self._ll
        n = len(scales)
        handles = (ll.llama_adapter_lora_p_ctypes * n)(*self.adapters) if n else None
        values = (ctypes.c_float * n)(*scales) if n else None
        with deferred_interrupt():
            ll.llama_set_adapters_lora(self.ctx, handles, n, values)
        self.lora = scales
        self.kv.current = lora_key(scales)

    def _init_context(self, ll, options: LoadOptions) -> None:
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

        cparams = ll.llama_context_default_params()
        cparams.n_ctx = options.n_ctx
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = min(options.n_ubatch, options.n_batch)
        cparams.n_seq_max = options.n_seq_max
        cparams.n_outputs_max = self.max_outputs = max(options.n_outputs, options.n_seq_max) if options.n_outputs else options.n_batch
        threads = self.n_threads = options.n_threads or default_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.type_k = _GGML_TYPES[options.kv_type]
        cparams.type_v = _GGML_TYPES[options.kv_type]
        cparams.swa_full = options.swa_full
        cparams.kv_unified = options.kv_unified or options.shared_kv
        cparams.no_perf = True
        if options.embeddings:
            cparams.embeddings = True
            cparams.pooling_type = POOLING[self.pooling]
        if options.flash_attn is None:
            # A quantized V cache needs flash attention; otherwise let llama.cpp pick.
            cparams.flash_attn_type = 1 if options.kv_type != "f16" else -1
        else:
            cparams.flash_attn_type = 1 if options.flash_attn else 0
        if self.backend_sampling:
            # Attached to every sequence (each of the server's slots) from the start, so that llama.cpp
            # sizes its graphs for them while loading, not while the first prompt waits (a later attach
            # costs a graph reservation: ~6 ms on an H100).
            n = options.n_seq_max
            configs = (ll.llama_sampler_seq_config * n)()
            for seq in range(n):
                chain = self._prefilter_chain(PREFILTER_K)
                configs[seq].seq_id, configs[seq].sampler = seq, ctypes.cast(chain, ctypes.c_void_p)
                self._prefilters[seq] = (chain, PREFILTER_K)
            cparams.samplers, cparams.n_samplers = configs, n
        self.ctx = ll.llama_init_from_model(self.model, cparams)

    # -- the one decode call ---------------------------------------------------------------

    @property
    def batch(self) -> Batch:
        """The engine's own batch (n_batch tokens), reused by every single-threaded generation."""
        if self._batch is None:
            self._batch = Batch(max(self.n_batch, self.options.n_seq_max))
        return self._batch

    def decode(self, batch: Batch) -> None:
        """Evaluate a batch. On success the KV token lists record its tokens; on failure nothing changes."""
        ll = self._ll
        if batch.outputs > self.max_outputs:  # llama.cpp would abort the process (an assertion)
            raise DecodeError(f"a batch asked for {batch.outputs} rows of logits; this context was loaded for "
                              f"{self.max_outputs}", -1)
        kv = self.kv
        seqs = set(batch.seqs)
        if self.adapters and not all(kv.matches(seq) for seq in seqs):  # (a caller's mistake: never decoded so)
            raise DecodeError("a batch would extend a sequence made under other LoRA scales", -1)
        batch.raw.n_tokens = batch.n
        rc = ll.llama_decode(self.ctx, batch.raw)
        if rc != 0:
            for seq in seqs:  # a batch stopped part-way may have left cells: back to what we know
                ll.llama_memory_seq_rm(kv.memory, seq, len(kv.tokens[seq]), -1)
            raise DecodeError(Phrase("llama.cpp decode failed (code {rc}) after {held} tokens: try a smaller {ctx} or {batch}",
                                     rc=rc, held=kv.held()), rc)
        tokens = kv.tokens
        for seq, tok in zip(batch.seqs, batch.tokens):
            tokens[seq].append(tok)
        for seq in seqs:
            kv.made_with[seq] = kv.current

    def logits(self, row: int, n_rows: int = 1):
        """The logits of batch row `row` (and the output rows after it) as a float32 numpy view. One row is
        read for every token (the sampler's greedy path, logprobs): its view of each address llama.cpp's
        output buffer has had is kept, not rebuilt."""
        import numpy as np

        ptr = llama_cpp_module().llama_get_logits_ith(self.ctx, row)
        if n_rows != 1:
            return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        view = self._rows.get(address)
        if view is None:
            if len(self._rows) > 4 * max(1, self.options.n_seq_max):  # the buffer moved: old views are stale
                self._rows.clear()
            view = self._rows[address] = np.frombuffer((ctypes.c_float * self.n_vocab).from_address(address), dtype=np.float32)
        return view

    def raw_logits(self, seq_id: int = 0) -> bool:
        """Whether the batch rows of sequence `seq_id` hold the whole vocabulary's logits: no backend top-k
        is attached to it."""
        return seq_id not in self._prefilters

    def synchronize(self) -> None:
        llama_cpp_module().llama_synchronize(self.ctx)  # a GPU backend may still be running when decode returns

    def reset(self) -> None:
        self.kv.clear()

    def check_fits(self, n_prompt: int, n_ctx: Optional[int] = None) -> None:
        n_ctx = n_ctx or self.n_ctx
        if n_prompt >= n_ctx:
            raise ContextOverflow(f"the prompt is {n_prompt} tokens but the context holds {n_ctx}", n_prompt, n_ctx,
                                  self.info.context_length)

    # -- embeddings -----------------------------------------------------------------------

    @property
    def n_embd(self) -> int:
        return self._ll.llama_model_n_embd(self.model)

    def embed(self, token_lists: Sequence[Sequence[int]]) -> list[list[float]]:
        """The pooled, L2-normalised embedding of each token list (an embeddings context): as many lists per
        decode as fit the batch and the context's sequences. Each sequence attends only to itself; its
        vector matches the one it gets alone up to float rounding (llama.cpp's CPU kernels round a batch of
        many rows differently from a small one)."""
        import numpy as np

        out = []
        for vec in self._pooled(token_lists, self.n_embd):
            vec = vec.astype(np.float64)
            norm = float(np.linalg.norm(vec))
            out.append((vec / norm if norm > 0 else vec).tolist())
        return out

    def rank(self, token_lists: Sequence[Sequence[int]]) -> list[float]:
        """A reranker's score of each token list (a query and a document put together: runtime.rerank), in a context
        loaded with rank pooling: the first of what llama.cpp's rank pooling gives per sequence (its classification
        head's output; a softmax's first, "yes", for Qwen3-Reranker), as llama-server's /rerank reads it.

        Each list is evaluated in a decode of its own: a score is then the same whatever else a request ranks, and
        llama-server's to the last bit where it has one slot (-np 1). Decoded beside others, a score moves by float
        rounding: five documents of 17 to 28 tokens in one decode scored up to 3e-5 apart from each alone, and so do
        llama-server's several slots (tests/cli/test_rerank.py)."""
        if self.pooling != "rank":
            raise EngineError("this context does not rank: load it with LoadOptions(embeddings=True, pooling='rank')")
        n_out = max(1, self._ll.llama_model_n_cls_out(self.model))
        return [float(self._pooled([tokens], n_out)[0][0]) for tokens in token_lists]

    def _pooled(self, token_lists: Sequence[Sequence[int]], width: int) -> list:
        """What llama.cpp's pooling gives for each token list, `width` floats each (numpy copies)."""
        import numpy as np

        if not self.options.embeddings:
            raise EngineError("this context makes no embeddings: load it with LoadOptions(embeddings=True)")
        ll, batch = self._ll, self.batch
        encode = ll.llama_encode if ll.llama_model_has_encoder(self.model) and not ll.llama_model_has_decoder(self.model) else ll.llama_decode
        out: list = [None] * len(token_lists)
        pending: list[int] = []

        def flush() -> None:
            if not pending:
                return
            batch.raw.n_tokens = batch.n
            try:
                with deferred_interrupt():
                    rc = encode(self.ctx, batch.raw)
                if rc != 0:
                    raise DecodeError(f"llama.cpp could not embed a batch of {batch.n} tokens (code {rc})", rc)
                for seq, index in enumerate(pending):
                    ptr = ll.llama_get_embeddings_seq(self.ctx, seq)
                    if not ptr:
                        raise EngineError("llama.cpp gave no pooled embedding for this model")
                    out[index] = np.ctypeslib.as_array(ptr, shape=(width,)).copy()
            finally:
                ll.llama_memory_clear(self.kv.memory, True)
                batch.clear()
                pending.clear()

        for index, tokens in enumerate(token_lists):
            if not tokens:
                raise UsageError("cannot embed an empty text")
            if len(tokens) > min(batch.capacity, self.n_ctx):
                raise ContextOverflow(Phrase("a text is {n} tokens but the context holds {held}: shorten it, or raise {ctx}",
                                             n=len(tokens), held=min(batch.capacity, self.n_ctx)), len(tokens), self.n_ctx)
            if batch.room() < len(tokens) or len(pending) == self.options.n_seq_max:
                flush()
            for pos, token in enumerate(tokens):
                batch.add(token, pos, len(pending), True)
            pending.append(index)
        flush()
        return out  # type: ignore[return-value]

    # -- backend sampling -----------------------------------------------------------------

    def _resolve_backend_sampling(self, ll, options: LoadOptions) -> bool:
        if options.kv_unified:
            return False  # beam search's context: it reads every beam's raw logits
        if options.backend_sampling is not None:
            return options.backend_sampling
        env = os.environ.get("LOCALRUN_BACKEND_SAMPLING", "auto").lower()
        if env in ("on", "1", "true"):
            return True
        if env in ("off", "0", "false"):
            return False
        # auto: where the output layer (offloaded last) sits on a GPU
        on_gpu = bool(self.devices) and not self.devices[-1].startswith("RPC")  # the output layer goes to the last device
        return on_gpu and (self.gpu_layers < 0 or self.gpu_layers > self.info.n_layer)

    def _prefilter_chain(self, k: int):
        ll = llama_cpp_module()
        params = ll.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = ll.llama_sampler_chain_init(params)
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(k))
        return chain

    def prefilter_for(self, k: Optional[int], seq_id: int = 0) -> bool:
        """Make sequence `seq_id` (a server slot, or the one sequence of a run) carry an exact top-k of at
        least k in llama.cpp's graph (backend sampling), or none (k None: the chain needs raw logits). With
        it, llama_sampler_sample gives the C chain those candidates, and the logits of that sequence's rows
        are never copied off the device. It stays attached between generations; any top-k at least as wide
        as the chain's own first cut picks the same tokens."""
        held = self._prefilters.get(seq_id)
        if k is not None and held is not None and k <= held[1]:
            return True
        self.use_raw_logits(seq_id)
        if k is None or not self.backend_sampling:
            return False
        ll = llama_cpp_module()
        k = max(k, PREFILTER_K)
        chain = self._prefilter_chain(k)
        with deferred_interrupt():  # llama.cpp logs here: a Ctrl-C is raised once the chain is recorded
            if ll.llama_set_sampler(self.ctx, seq_id, chain):
                self._prefilters[seq_id] = (chain, k)
            else:
                ll.llama_sampler_free(chain)
        return seq_id in self._prefilters

    def prefilter_failed(self, row: int) -> bool:
        """Whether the device left no top-k candidates for `row` (it could not run the prefilter): then
        backend sampling goes off for good, on every sequence, and the caller evaluates the row's token
        again."""
        if llama_cpp_module().llama_get_sampled_candidates_ith(self.ctx, row):
            return False
        self.use_raw_logits()
        self.backend_sampling = False  # for good: the next generation would only fall back again
        return True

    def use_raw_logits(self, seq_id: Optional[int] = None) -> None:
        """For whatever reads the logits itself (speculative decoding, beam search, perplexity, a request
        for logprobs): no prefilter on sequence `seq_id` (None: on any) from here on, until a plain
        generation attaches one again."""
        seqs = [seq for seq in self._prefilters if seq_id is None or seq == seq_id]
        if not seqs:
            return
        ll = llama_cpp_module()
        with deferred_interrupt():
            for seq in seqs:
                chain, _ = self._prefilters.pop(seq)
                if self.ctx:
                    ll.llama_set_sampler(self.ctx, seq, None)
                ll.llama_sampler_free(chain)

    # -- lifecycle -------------------------------------------------------------------------

    def load_projector(self, path: Path | str):
        """Load a vision projector (an mmproj GGUF) for this model: prompts may then hold images
        (engine.vision). The one already loaded from the same file is kept."""
        from .vision import Projector

        if self.vision is not None and self.vision.path == Path(path):
            return self.vision
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        self.vision = Projector(self, path)
        return self.vision

    def _place(self, mparams, options: LoadOptions) -> None:
        """The devices layers may go to besides the CPU (self.devices, their names): these RPC workers' first
        (as llama.cpp orders them), then local GPUs. Named explicitly once any worker was added in this
        process, so that a model loaded without --rpc uses none another model added (ggml's registry is
        per process)."""
        import ctypes

        from . import rpc
        from .footprint import repack_allowed
        from .llama import device_name, local_gpus

        handles = rpc.add_workers(options.rpc) + local_gpus()
        self.devices = [device_name(h) for h in handles]
        if options.rpc or not repack_allowed():
            # The CPU's layers beside a worker's stay in plain CPU buffers, not llama.cpp's repacked ones: with
            # those, a split model's greedy output drifted from the same model run here alone (gemma-3 Q4_K_M).
            mparams.use_extra_bufts = False
        if rpc.any_added():
            self._device_array = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
            mparams.devices = ctypes.cast(self._device_array, ctypes.c_void_p).value
        if options.tensor_split:
            if len(options.tensor_split) > len(handles):
                raise UsageError(Phrase("{tensor_split} has {n} proportions for {m} devices ({devices}): give one per device",
                                        n=len(options.tensor_split), m=len(handles),
                                        devices=', '.join(self.devices) or 'none besides the CPU'))
            self._split_array = (ctypes.c_float * self._ll.llama_max_devices())(*options.tensor_split)
            mparams.tensor_split = self._split_array

    def gpu_fraction(self) -> float:
        """The share of the model's layers (repeating layers plus the output layer, as llama.cpp counts
        them for --gpu-layers) placed on a GPU: 0 on a CPU build."""
        total = self.info.n_layer + 1
        if self.gpu_layers < 0:
            return 1.0
        return min(self.gpu_layers, total) / total

    def close(self) -> None:
        if not loaded():
            return
        ll = llama_cpp_module()
        with deferred_interrupt():  # llama.cpp logs while it frees: see deferred_interrupt()
            if getattr(self, "_prefilters", None):
                self.use_raw_logits()
            if getattr(self, "vision", None) is not None:
                self.vision.close()  # before the model it was loaded for
                self.vision = None
            if getattr(self, "_batch", None) is not None:
                self._batch.close()
                self._batch = None
            if getattr(self, "ctx", None):
                ll.llama_free(self.ctx)
                self.ctx = None
            if getattr(self, "model", None):
                ll.llama_model_free(self.model)
                self.model = None
                self._release_workers()

    def _release_workers(self) -> None:
        if getattr(self, "options", None) is not None and self.options.rpc and not getattr(self, "_workers_released", False):
            from . import rpc

            self._workers_released = True
            rpc.release_workers(self.options.rpc)

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

    def infill_tokens(self, prefix: str, suffix: str) -> Optional[list[int]]:
        """A fill-in-the-middle prompt in the model's own FIM tokens, as llama-server's /infill makes it
        (prefix-suffix-middle: <fim_pre>PREFIX<fim_suf>SUFFIX<fim_mid>, BOS first where the model adds one);
        None for a model without them (not a code model)."""
        ll = llama_cpp_module()
        pre, suf, mid = (ll.llama_vocab_fim_pre(self.vocab), ll.llama_vocab_fim_suf(self.vocab), ll.llama_vocab_fim_mid(self.vocab))
        if min(pre, suf, mid) < 0:
            return None
        tokens = [pre, *self.tokenize(prefix, False, False), suf, *self.tokenize(suffix, False, False), mid]
        if ll.llama_vocab_get_add_bos(self.vocab):
            tokens.insert(0, ll.llama_vocab_bos(self.vocab))
        return tokens

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        buf = self._piece_buf
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n >= 0:
            return buf.raw[:n]
        piece, self._piece_buf = _token_piece(self.vocab, token, buf, special)
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        # Its own buffer, not token_bytes' shared one: the server calls this outside the decode thread.
        buf, out = ctypes.create_string_buffer(256), []
        for t in tokens:
            piece, buf = _token_piece(self.vocab, t, buf, False)
            out.append(piece)
        return b"".join(out).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(self._ll.llama_vocab_is_eog(self.vocab, token))

    def warm_up(self) -> None:
        """Pay at load what the first request would (llama-server warms up the same way): one decode, so that
        llama.cpp builds and allocates its graph (on a GPU: loads its kernels), leaving the cache empty. Call
        it from the thread that decodes afterwards: llama.cpp's CPU threads (OpenMP) belong to the thread that
        starts them, and a second team, warmed from another thread, slowed decoding by ~10% here."""
        batch = Batch(1)
        try:
            bos = self.bos_token
            batch.add(bos if 0 <= bos < self.n_vocab else 0, 0, 0, True)
            self.decode(batch)
        finally:
            batch.close()
            self.kv.clear(0)

    def eog_tokens(self) -> list[int]:
        if self._eog is None:  # a walk over the whole vocabulary (262k for gemma): once per model
            ll = llama_cpp_module()
            self._eog = [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]
        return self._eog

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp_module().llama_vocab_get_add_bos(self.vocab))

    @property
    def bos_token(self) -> int:
        return llama_cpp_module().llama_vocab_bos(self.vocab)

    @property
    def chat_template(self) -> Optional[str]:
        return self.template_override or self.info.chat_template
