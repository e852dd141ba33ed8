"""What `localrun bench` measures: prefill and decode speed, TTFT, TPOT, load time, memory and perplexity, measured
on localrun's own generation path and, with --compare llama-bench, next to llama.cpp's own tools run
with the same settings in the same invocation.

What is measured, per model and per combination of swept settings:
  ppN      prefill: N prompt tokens evaluated into a fresh context (llama-bench `-p N -n 0`)
  tgN@dD   decode: the engine's generate with the default sampler chain and end-of-text suppressed, after a
           D-token context, timed from the first token over N decode steps (llama-bench `-p 0 -n N -d D`)
  ppl@cC   perplexity on the bundled text (data/wonderland.txt), llama-perplexity's method with chunks
           of C tokens (--quality)
After one warm-up per test, each is repeated --reps times; rows report the mean, the sample standard
deviation (as llama-bench does) and the median of the per-repetition tokens/s.

Every row of `--output json` validates against RESULT_SCHEMA below.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from ...engine.options import KV_TYPES
from ...errors import EngineError, LocalrunError, Phrase, SettingError, SettingsConflict, UsageError
from ..options import LoadSpec

if TYPE_CHECKING:
    from ...engine.strategies import Perplexity

OUTPUTS = ("table", "json", "csv", "md")
FLASH_ATTN = {"auto": None, "on": True, "off": False}  # --flash-attn's words, each LoadSpec.flash_attn's value
QUALITY_CTX = 512  # llama-perplexity's default chunk
TEXT = "wonderland.txt"
BUILD_SCRIPT = "scripts/build_llama_bench.sh"

SETTINGS = ("threads", "ctx", "batch", "kv_type", "gpu_layers", "flash_attn", "decode")
_NUMBER = {"type": "number", "exclusiveMinimum": 0}
_NULLABLE_NUMBER = {"type": ["number", "null"], "minimum": 0}

RESULT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "localrun bench results",
    "description": "A list of result rows, in the order measured: models in argument order, then each "
    "combination of swept settings, then the pp tests, the tg tests (tg x depth) and the ppl test.",
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "model", "model_path", "test", "kind", "n_tokens", "depth", "settings", "reps", "mean_ts", "std_ts",
            "median_ts", "samples_ts", "ttft_ms", "tpot_ms", "load_ms", "peak_rss_bytes", "kv_bytes",
            "device_bytes", "build", "quant", "file_bytes", "memory_bytes",
        ],
        "properties": {
            "model": {"type": "string", "description": "the model as given (file name for a path)"},
            "model_path": {"type": "string"},
            "test": {"type": "string", "description": "ppN, tgN@dD or ppl@cC", "pattern": r"^(pp\d+|tg\d+@d\d+|ppl@c\d+)$"},
            "kind": {"enum": ["pp", "tg", "ppl"]},
            "n_tokens": {"type": "integer", "minimum": 1, "description": "tokens timed (ppl: tokens scored)"},
            "depth": {"type": "integer", "minimum": 0, "description": "tokens already in the context"},
            "settings": {
                "type": "object",
                "additionalProperties": False,
                "required": list(SETTINGS),
                "properties": {
                    "threads": {"type": "integer", "minimum": 1},
                    "ctx": {"type": "integer", "minimum": 16, "description": "context of the speed tests "
                            "(a ppl row's chunk is the C of its test name)"},
                    "batch": {"type": "integer", "minimum": 1},
                    "kv_type": {"enum": list(KV_TYPES)},
                    "gpu_layers": {"type": ["integer", "string"]},
                    "flash_attn": {"enum": list(FLASH_ATTN)},
                    "decode": {"type": "string", "description": "plain, lookup, draft:MODEL or beamsN"},
                    "rpc": {"type": "string", "description": "llama.cpp RPC workers (--rpc), when given"},
                },
            },
            "reps": {"type": "integer", "minimum": 1},
            "mean_ts": {**_NUMBER, "description": "tokens/s, mean over repetitions"},
            "std_ts": {"type": "number", "minimum": 0, "description": "sample standard deviation (0 for one rep)"},
            "median_ts": _NUMBER,
            "samples_ts": {"type": "array", "items": _NUMBER, "minItems": 1},
            "ttft_ms": {**_NULLABLE_NUMBER, "description": "time to first token for a prompt of the first --pp "
                        "length, median over repetitions; the same on every row of a model+settings"},
            "tpot_ms": {**_NULLABLE_NUMBER, "description": "time per output token (tg rows), median"},
            "load_ms": {**_NUMBER, "description": "wall time to load the model and create the context"},
            "peak_rss_bytes": {"type": "integer", "minimum": 1, "description": "peak resident memory while this "
                               "model+settings ran (process-wide peak where it cannot be reset)"},
            "kv_bytes": {"type": "integer", "minimum": 0, "description": "KV cache llama.cpp allocated"},
            "device_bytes": {"type": ["integer", "null"], "minimum": 0, "description": "GPU buffers; null = n/a"},
            "build": {"type": "string"},
            "ppl": {**_NUMBER, "description": "perplexity (ppl rows)"},
            "ppl_error": {"type": "number", "minimum": 0, "description": "its +/- (llama-perplexity's estimate)"},
            "ppl_ratio": {**_NUMBER, "description": "perplexity / the lowest perplexity of this run (ppl rows)"},
            "quant": {"type": "string", "description": "the file's quant (from its GGUF header)"},
            "file_bytes": {"type": "integer", "minimum": 1, "description": "size of the model file(s)"},
            "memory_bytes": {"type": "integer", "minimum": 1, "description": "weights + KV cache at the context"},
            "ref_mean_ts": {**_NULLABLE_NUMBER, "description": "llama-bench's mean tokens/s, same settings"},
            "ref_std_ts": _NULLABLE_NUMBER,
            "ref_median_ts": {**_NULLABLE_NUMBER, "description": "llama-bench's median tokens/s (the ratio's denominator)"},
            "ref_spread": {"type": "number", "minimum": 0, "description": "llama-bench's sample std / mean: over "
                           "0.2 the ratio is flagged as unreliable"},
            "ref_ppl": {**_NUMBER, "description": "llama-perplexity's final estimate (ppl rows)"},
            "ratio": {**_NUMBER, "description": "ours / reference: median tokens/s for pp and tg, perplexity for ppl"},
        },
    },
}

CSV_FIELDS = [
    "model", "test", "kind", "n_tokens", "depth", *SETTINGS, "reps", "mean_ts", "std_ts", "median_ts",
    "ref_mean_ts", "ref_std_ts", "ref_median_ts", "ref_spread", "ratio", "ppl", "ppl_error", "ppl_ratio", "ref_ppl", "quant", "file_bytes",
    "memory_bytes", "ttft_ms", "tpot_ms", "load_ms",
    "peak_rss_bytes", "kv_bytes", "device_bytes", "build", "model_path",
]


# -- the plan: every argument parsed and checked before anything is loaded -------------------------


def _loaded_by(name: str) -> property:
    return property(lambda self: getattr(self.spec, name), doc=f"this row's LoadSpec.{name}")


@dataclass(frozen=True)
class Settings:
    """One combination of swept settings: the load, in the one shape every load takes (runtime.options.LoadSpec:
    its threads resolved, as rows report them; ctx None: sized to fit the tests; gpu_layers a number of layers
    or "auto"; rpc, tensor_split and LoRA adapters the same on every row), and bench's decoding word."""

    spec: LoadSpec
    decode: str = "plain"  # plain, lookup, draft:MODEL or beamsN (engine/strategies.py)

    threads = _loaded_by("threads")
    ctx = _loaded_by("ctx")
    batch = _loaded_by("batch")
    kv_type = _loaded_by("kv_type")
    gpu_layers = _loaded_by("gpu_layers")
    rpc = _loaded_by("rpc")
    tensor_split = _loaded_by("tensor_split")
    lora = _loaded_by("lora")

    @property
    def flash_attn(self) -> str:
        """auto, on or off (FLASH_ATTN's word for the spec's value)."""
        return next(word for word, value in FLASH_ATTN.items() if value is self.spec.flash_attn)

    def n_ctx(self, tests: Sequence["Test"]) -> int:
        return self.ctx if self.ctx is not None else max([16, *(t.context_needed for t in tests)])

    def load_options(self, n_ctx: int):
        """The engine's options for this row, built as every load builds them (LoadSpec.engine_options):
        one sequence, with logits for every row of a batch (perplexity reads them all; 0 = n_batch rows)
        where beams do not size them."""
        from dataclasses import replace

        decoding = self.decoding()
        options = self.spec.engine_options(n_ctx, decoding)
        return options if decoding.beams > 1 else replace(options, n_outputs=0)

    def decoding(self):
        return parse_decode(self.decode)

    def llama_args(self) -> list[str]:
        """The same settings for llama-bench / llama-perplexity, resolved as Engine resolves them."""
        from ...engine.llama import supports_gpu_offload

        layers = self.gpu_layers
        if layers == "auto":
            layers = "-1" if supports_gpu_offload() else "0"
        fa = "on" if self.flash_attn == "auto" and self.kv_type != "f16" else self.flash_attn
        adapters = ["--lora-scaled", ",".join(f"{path}:{scale!r}" for path, scale in self.lora)] if self.lora else []
        return ["-t", str(self.threads), "-ngl", layers, "-fa", fa, "-ctk", self.kv_type, "-ctv", self.kv_type, *adapters]

    def as_dict(self, n_ctx: int) -> dict[str, Any]:
        layers: Any = self.gpu_layers if self.gpu_layers == "auto" else int(self.gpu_layers)
        out = {"threads": self.threads, "ctx": n_ctx, "batch": self.batch, "kv_type": self.kv_type,
               "gpu_layers": layers, "flash_attn": self.flash_attn, "decode": self.decode}
        if self.rpc:
            out["rpc"] = self.rpc
        if self.lora:
            out["lora"] = [f"{path}:{scale:g}" for path, scale in self.lora]
        return out


@dataclass(frozen=True)
class Test:
    kind: Literal["pp", "tg"]
    n_tokens: int
    depth: int = 0

    @property
    def name(self) -> str:
        return f"pp{self.n_tokens}" if self.kind == "pp" else f"tg{self.n_tokens}@d{self.depth}"

    @property
    def context_needed(self) -> int:
        # tg: the context plus N+1 sampled tokens, the last never decoded (see decode_seconds).
        return self.n_tokens + 1 if self.kind == "pp" else max(self.depth, 1) + self.n_tokens + 1


@dataclass(frozen=True)
class Plan:
    models: list[str]
    tests: list[Test]
    settings: list[Settings]
    reps: int
    output: str = "table"
    llama_bench: Optional[Path] = None  # set: compare against it
    quality: bool = False
    plot: Optional[Path] = None
    source: str = "auto"

    @property
    def ttft_tokens(self) -> Optional[int]:
        return next((t.n_tokens for t in self.tests if t.kind == "pp"), None)


def make_plan(
    models: Sequence[str],
    *,
    pp: str = "512",
    tg: str = "128",
    depth: str = "0",
    reps: int = 5,
    threads: Optional[str] = None,
    ctx: Optional[str] = None,
    batch: str = str(LoadSpec.batch),
    kv_type: str = LoadSpec.kv_type,
    gpu_layers: str = LoadSpec.gpu_layers,
    flash_attn: str = "auto",
    decode: str = "plain",
    output: str = "table",
    compare: Optional[str] = None,
    llama_bench: Optional[Path] = None,
    quality: bool = False,
    plot: Optional[Path] = None,
    source: str = "auto",
    rpc: Optional[str] = None,
    tensor_split: Optional[str] = None,
    lora: Optional[Sequence[str]] = None,
) -> Plan:
    """Parse and check every option (naming the bad value), find llama-bench if asked to compare."""
    from ...engine import KV_TYPES, default_threads, parse_gpu_layers

    models = [m.strip() for arg in models for m in arg.split(",") if m.strip()]  # A,B,C as well as A B C
    if not models:
        raise UsageError("give at least one model to benchmark")
    if output not in OUTPUTS:
        raise SettingError("output", output, f"use {', '.join(OUTPUTS)}")
    if reps < 1:
        raise SettingError("reps", reps, "use 1 or more")
    if compare not in (None, "llama-bench"):
        raise SettingError("compare", compare, "the one reference is llama-bench")
    pps = _ints("pp", pp, minimum=0)
    tgs = _ints("tg", tg, minimum=0)
    depths = _ints("depth", depth, minimum=0)
    # 0 means "no such test", as in llama-bench (-p 0 / -n 0).
    tests = [Test("pp", n) for n in pps if n] + [Test("tg", n, d) for n in tgs if n for d in depths]
    if not tests and not quality:
        raise UsageError(Phrase("nothing to measure: {pp} and {tg} are both 0 (add {quality} for perplexity only)"))
    thread_values = _ints("threads", threads, minimum=1) if threads else [default_threads()]
    ctx_values: list[Optional[int]] = list(_ints("ctx", ctx, minimum=16)) if ctx else [None]
    batches = _ints("batch", batch, minimum=1)
    kv_types = _words("kv_type", kv_type, KV_TYPES)
    layer_values = [str(parse_gpu_layers(v)) for v in _split("gpu_layers", gpu_layers)]
    fa_values = _words("flash_attn", flash_attn, FLASH_ATTN)
    decodes = _split("decode", decode)
    for value in decodes:
        parse_decode(value)  # refused here, before anything runs
    from ...engine.rpc import parse_endpoints
    from ..workers import parse_tensor_split

    parse_endpoints(rpc), parse_tensor_split(tensor_split)  # refused here, before anything runs
    if rpc and compare:
        raise SettingsConflict(("compare", "rpc"), Phrase("compare a local run, or sweep {gpu_layers} 0,-1 with {rpc}"))
    from ..lora import parse_adapters

    adapters = parse_adapters(lora or [])  # each a LoRA GGUF; against each model once it is here (run)
    if adapters and compare:
        raise SettingsConflict(("compare", "lora"), "llama-bench loads no LoRA adapters")
    settings = [Settings(LoadSpec(threads=n_threads, ctx=n_ctx, batch=n_batch, kv_type=kv, gpu_layers=layers, flash_attn=FLASH_ATTN[fa],
                                  rpc=rpc or None, tensor_split=tensor_split or None, lora=adapters), decode=value)
                for n_threads, n_ctx, n_batch, kv, layers, fa, value in
                itertools.product(thread_values, ctx_values, batches, kv_types, layer_values, fa_values, decodes)]
    for s in settings:
        if s.kv_type != "f16" and s.flash_attn == "off":
            raise UsageError(Phrase("{kv_type} {kv} quantizes the V cache, which needs flash attention: drop {flash_attn} off",
                                        kv=s.kv_type))
        for t in tests:
            if s.ctx is not None and t.context_needed > s.ctx:
                raise UsageError(Phrase("{ctx} {n_ctx} is too small for {test}: it needs {needed} tokens", n_ctx=s.ctx,
                                            test=t.name, needed=t.context_needed))
    exe = None
    if compare or llama_bench is not None:
        exe = find_llama_bench(llama_bench)
    if plot is not None:
        require_matplotlib()
    return Plan(models=list(models), tests=tests, settings=settings, reps=reps, output=output, llama_bench=exe,
                quality=quality, plot=plot, source=source)


def parse_decode(value: str):
    """A --decode value as decoding.DecodeOptions: plain, lookup, draft:MODEL or beamsN."""
    from ...engine import DecodeOptions

    if value == "plain":
        return DecodeOptions()
    if value == "lookup" or value.startswith("draft:") and len(value) > 6:
        return DecodeOptions(draft=value.removeprefix("draft:"))
    if value.startswith("beams") and value[5:].isdigit() and 1 < int(value[5:]) <= 64:
        return DecodeOptions(beams=int(value[5:]))
    raise SettingError("decode", value, "use plain, lookup, draft:MODEL or beamsN (e.g. beams4)")


def _split(setting: str, value: str) -> list[str]:
    parts = [p.strip() for p in str(value).split(",")]
    if not parts or any(p == "" for p in parts):
        raise SettingError(setting, value, Phrase("give comma-separated values, e.g. {%s} 1,2" % setting))
    return parts


def _ints(setting: str, value: str, minimum: int) -> list[int]:
    out = []
    for part in _split(setting, value):
        try:
            n = int(part)
        except ValueError:
            raise UsageError(Phrase("invalid {%s} value {part!r}: give whole numbers, comma-separated" % setting,
                                    part=part)) from None
        if n < minimum:
            raise UsageError(Phrase("invalid {%s} value {n}: use {minimum} or more" % setting, n=n, minimum=minimum))
        out.append(n)
    return out


def _words(setting: str, value: str, allowed: Collection[str]) -> list[str]:
    parts = _split(setting, value)
    for p in parts:
        if p not in allowed:
            raise UsageError(Phrase("invalid {%s} value {p!r}: use {allowed}" % setting, p=p, allowed=", ".join(allowed)))
    return parts


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise LocalrunError(Phrase("{plot} needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)")) from None


def find_llama_bench(explicit: Optional[Path] = None) -> Path:
    """--llama-bench PATH, else llama-bench on PATH, else the scripts/build_llama_bench.sh cache."""
    if explicit is not None:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise UsageError(Phrase("{llama_bench} {path}: not an executable file", path=explicit))
        return Path(explicit)
    found = shutil.which("llama-bench")
    if found:
        return Path(found)
    cached = _tools_dir() / "llama-bench"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    raise LocalrunError(Phrase("llama-bench not found (not on PATH, nor in {where}): build it with {script} or pass"
                               " {llama_bench} PATH", where=cached.parent, script=BUILD_SCRIPT))


def find_llama_perplexity(llama_bench: Optional[Path]) -> Optional[Path]:
    """llama-perplexity next to llama-bench (the build script makes both), else on PATH, else the cache."""
    candidates = [llama_bench.parent / "llama-perplexity"] if llama_bench else []
    which = shutil.which("llama-perplexity")
    candidates += [Path(which)] if which else []
    candidates.append(_tools_dir() / "llama-perplexity")
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _tools_dir() -> Path:
    from importlib.metadata import version

    return Path.home() / ".cache" / "localrun" / f"llama-bench-{version('llama-cpp-python')}" / "bin"


# -- measuring ---------------------------------------------------------------------------------------


def text_path() -> Path:
    from importlib.resources import files

    return Path(str(files("localrun") / "data" / TEXT))


def prompt_tokens(engine, n: int) -> list[int]:
    """n tokens of the bundled prose (repeated past its end); speed does not depend on which tokens."""
    tokens = engine.tokenize(text_path().read_text(encoding="utf-8"), add_special=True, parse_special=False)
    body = tokens[1:] if engine.info.bos_token_id is not None and tokens[0] == engine.info.bos_token_id else tokens
    while len(tokens) < n:
        tokens = tokens + body
    return tokens[:n]


def prefill_seconds(engine, tokens: Sequence[int]) -> float:
    from ...engine.loop import evaluate

    engine.reset()
    t0 = time.perf_counter()
    evaluate(engine, tokens)
    engine.synchronize()
    return time.perf_counter() - t0


def decode_seconds(engine, context: Sequence[int], n: int, seed: int = 1, strategy=None) -> float:
    """Seconds for n decode steps after `context`, on the engine's own generation path, timed from the first
    token. n+1 tokens are sampled so that n decodes (each followed by a sample) lie between the first and the
    last token, as llama-bench's -n counts decodes."""
    from ...engine import SamplingOptions, generate
    from ...engine.strategies import BeamSearch

    engine.reset()
    if isinstance(strategy, BeamSearch):  # not streamed: its own clock, end-of-text banned
        opts = SamplingOptions(max_tokens=n + 1, logit_bias={t: float("-inf") for t in engine.eog_tokens()})
        final = [r for r in generate(engine, list(context), opts, strategy=strategy) if r.done][-1]
        return final.stats.eval_s
    opts = SamplingOptions(max_tokens=n + 1, min_tokens=n + 1, seed=seed)  # default chain, end-of-text banned
    stamps = []
    for response in generate(engine, list(context), opts, strategy=strategy):
        if response.tokens:
            stamps.extend([time.perf_counter()] * len(response.tokens))
    return stamps[-1] - stamps[0]


def ttft_seconds(engine, prompt: Sequence[int], seed: int = 1, strategy=None) -> float:
    """Wall time from asking for an answer to the first token, for a fresh context."""
    from ...engine import SamplingOptions, generate

    engine.reset()
    t0 = time.perf_counter()
    # As `run` samples (no min_tokens): the first response comes once the first token is sampled, be it
    # text or end-of-text (then it is the last one).
    responses = generate(engine, list(prompt), SamplingOptions(max_tokens=1, seed=seed), strategy=strategy)
    try:
        next(responses)
        return time.perf_counter() - t0
    finally:
        responses.close()


def perplexity(engine, text: str, n_ctx: int = QUALITY_CTX, max_chunks: Optional[int] = None):
    """Perplexity on `text` in chunks of n_ctx tokens (llama-perplexity's method, engine/strategies.py)."""
    from ...engine.strategies import perplexity as measure

    return measure(engine, text, n_ctx, max_chunks)


# -- memory -------------------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: writing 5 to clear_refs resets VmHWM). False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


_BUFFER = re.compile(r"^\s*\w+:\s+(?P<dev>\S+)\s+(?P<kind>model|KV|compute|output) buffer size\s*=\s*(?P<mib>[\d.]+) MiB")


def allocated_buffers(log_lines: Sequence[str]) -> tuple[Optional[int], Optional[int]]:
    """(KV bytes, device bytes) from the buffer sizes llama.cpp logs while loading; device bytes are
    the buffers not in host memory (None: nothing offloaded, or no such line)."""
    kv = device = 0
    seen_kv = seen_device = False
    for line in "".join(log_lines).splitlines():
        m = _BUFFER.match(line)
        if not m:
            continue
        size = int(float(m["mib"]) * 1024 * 1024)
        if m["kind"] == "KV":
            kv += size
            seen_kv = True
        dev = m["dev"]
        if not (dev.startswith("CPU") or dev.endswith("_Host")):
            device += size
            seen_device = True
    return (kv if seen_kv else None), (device if seen_device else None)


# -- running ------------------------------------------------------------------------------------------


@dataclass
class ConfigRun:
    """Facts about one model loaded with one combination of settings, shared by its rows."""

    model: str
    path: Path
    settings: Settings
    n_ctx: int
    build: str
    load_ms: float = 0.0
    kv_bytes: int = 0
    device_bytes: Optional[int] = None
    ttft_ms: Optional[float] = None
    peak_rss_bytes: int = 0
    quant: str = ""
    file_bytes: int = 0
    memory_bytes: int = 0  # weights + KV cache at the context


@dataclass
class Result:
    config: ConfigRun
    kind: Literal["pp", "tg", "ppl"]
    test: str
    n_tokens: int
    depth: int
    samples_ts: list[float]
    tpot_ms: Optional[float] = None
    ref: Optional[dict] = None  # llama-bench: mean_ts, std_ts
    ppl: Optional["Perplexity"] = None
    ref_ppl: Optional[float] = None
    compared: bool = False

    @property
    def mean_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def std_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    @property
    def median_ts(self) -> float:
        return statistics.median(self.samples_ts)

    @property
    def ratio(self) -> Optional[float]:
        if self.kind == "ppl":
            return self.ppl.ppl / self.ref_ppl if self.ppl and self.ref_ppl else None
        # Medians: one slow repetition on a shared machine should not move the verdict.
        return self.median_ts / self.ref["median_ts"] if self.ref else None

    def as_row(self) -> dict[str, Any]:
        c = self.config
        row: dict[str, Any] = {
            "model": c.model, "model_path": str(c.path), "test": self.test, "kind": self.kind,
            "n_tokens": self.n_tokens, "depth": self.depth, "settings": c.settings.as_dict(c.n_ctx),
            "reps": len(self.samples_ts), "mean_ts": _r(self.mean_ts), "std_ts": _r(self.std_ts),
            "median_ts": _r(self.median_ts), "samples_ts": [_r(s) for s in self.samples_ts],
            "ttft_ms": _r(c.ttft_ms), "tpot_ms": _r(self.tpot_ms), "load_ms": _r(c.load_ms),
            "peak_rss_bytes": c.peak_rss_bytes, "kv_bytes": c.kv_bytes, "device_bytes": c.device_bytes,
            "build": c.build, "quant": c.quant, "file_bytes": c.file_bytes, "memory_bytes": c.memory_bytes,
        }
        if self.ppl is not None:
            row["ppl"] = round(self.ppl.ppl, 4)
            row["ppl_error"] = round(self.ppl.error, 5)
        if self.compared:
            if self.kind == "ppl":
                if self.ref_ppl is not None:
                    row["ref_ppl"] = round(self.ref_ppl, 4)
            else:
                row["ref_mean_ts"] = _r(self.ref["mean_ts"]) if self.ref else None
                row["ref_std_ts"] = _r(self.ref["std_ts"]) if self.ref else None
                row["ref_median_ts"] = _r(self.ref["median_ts"]) if self.ref else None
                if self.ref:  # how far the reference's own repetitions spread: over REF_NOISY, its ratio is no verdict
                    row["ref_spread"] = _r(self.ref["std_ts"] / self.ref["mean_ts"], 4)
            if self.ratio is not None:
                row["ratio"] = round(self.ratio, 4)
        return row


def _r(x: Optional[float], digits: int = 3) -> Optional[float]:
    return None if x is None else round(x, digits)


Status = Callable[[str], None]


def run(plan: Plan, status: Status = lambda _: None, notice: Status = lambda _: None) -> Iterator[Result]:
    """Measure everything in the plan, yielding each result as soon as it is complete."""
    from ... import hub
    from ...engine import build_id

    locals_ = []
    from ..lora import check_adapters

    for ref in plan.models:  # resolve (and pull) every model first: a typo fails before minutes of measuring
        local = hub.ensure_local(ref, source=plan.source)
        check_adapters(plan.settings[0].lora if plan.settings else (), local.path)  # made for this model
        locals_.append((local.path.name if local.source == "path" else local.ref, local.path))
    build = build_id()
    for (name, path), settings in itertools.product(locals_, plan.settings):
        # Perplexity alone: the context is its chunk.
        n_ctx = settings.n_ctx(plan.tests) if plan.tests else settings.ctx or QUALITY_CTX
        config = ConfigRun(name, path, settings, n_ctx, build)
        yield from _run_config(plan, config, status, notice)


def _run_config(plan: Plan, config: ConfigRun, status: Status, notice: Status) -> Iterator[Result]:
    reset_peak_rss()
    try:
        if plan.tests:
            engine, strategy = _load(config, config.n_ctx, status, notice)
            try:
                yield from _speed_tests(plan, config, engine, strategy, status)
            finally:
                strategy.close()
                engine.close()
        if plan.quality:
            yield _quality(plan, config, status, notice)
    finally:
        config.peak_rss_bytes = peak_rss_bytes()


def _load(config: ConfigRun, n_ctx: int, status: Status, notice: Status):
    from ...engine import Engine
    from ...engine.gguf_info import kv_cache_bytes
    from ...engine.llama import captured_llama_log
    from ..loader import strategy_for

    status(f"{config.model}: loading")
    options = config.settings.load_options(n_ctx)
    t0 = time.perf_counter()
    with captured_llama_log() as lines:
        engine = Engine(config.path, options)
    load_ms = (time.perf_counter() - t0) * 1000
    strategy = strategy_for(engine, config.settings.decoding(), ctx_limit=n_ctx)
    if engine.gpu_notice:
        notice(engine.gpu_notice)
    if not config.load_ms:  # the first load of this model+settings is the one reported
        kv, device = allocated_buffers(lines)
        config.load_ms = load_ms
        try:  # exact, where the log rounds to 0.01 MiB (test_bench checks the two agree)
            # the context as loaded: beam search's is larger than the one asked for (room for N answers)
            config.kv_bytes = kv_cache_bytes(engine.info, options.n_ctx, config.settings.kv_type, n_ubatch=options.n_ubatch)
        except LocalrunError:
            config.kv_bytes = kv or 0
        config.device_bytes = device
        config.quant, config.file_bytes = engine.info.quant, engine.info.file_size
        config.memory_bytes = engine.info.tensor_bytes + config.kv_bytes
    return engine, strategy


def _speed_tests(plan: Plan, config: ConfigRun, engine, strategy, status: Status) -> Iterator[Result]:
    label = config.model
    if plan.ttft_tokens:
        prompt = prompt_tokens(engine, plan.ttft_tokens)
        status(f"{label}: time to first token (pp{plan.ttft_tokens}), warm-up")
        ttft_seconds(engine, prompt, strategy=strategy)
        samples = []
        for rep in range(plan.reps):
            status(f"{label}: time to first token (pp{plan.ttft_tokens}), {rep + 1}/{plan.reps}")
            samples.append(ttft_seconds(engine, prompt, seed=rep + 1, strategy=strategy))
        config.ttft_ms = statistics.median(samples) * 1000
    for test in plan.tests:
        # The reference gets what ours gets: one warm-up and --reps repetitions in one llama-bench run
        # (`-r N`; llama-bench warms up itself). One llama-bench run per repetition (`-r 1`) loads the model
        # each time and measures a cold first pass: on an H100 it read 17.9k t/s of pp512 where -r 5 read 48k.
        ref = None
        if plan.llama_bench is not None:
            status(f"{label}: {test.name}, llama-bench ({plan.reps} reps)")
            ref = run_llama_bench(plan.llama_bench, config, test, plan.reps)
        step = f"{label}: {test.name}"
        if test.kind == "pp":
            tokens = prompt_tokens(engine, test.n_tokens)
            status(f"{step}, warm-up")
            prefill_seconds(engine, tokens)
            samples = []
            for rep in range(plan.reps):
                status(f"{step}, {rep + 1}/{plan.reps}")
                samples.append(test.n_tokens / prefill_seconds(engine, tokens))
            yield Result(config, "pp", test.name, test.n_tokens, 0, samples, ref=ref, compared=ref is not None)
        else:
            context = prompt_tokens(engine, max(test.depth, 1))
            status(f"{step}, warm-up")
            decode_seconds(engine, context[:1], 2, strategy=strategy)
            seconds = []
            for rep in range(plan.reps):
                status(f"{step}, {rep + 1}/{plan.reps}")
                seconds.append(decode_seconds(engine, context, test.n_tokens, seed=rep + 1, strategy=strategy))
            samples = [test.n_tokens / s for s in seconds]
            tpot_ms = statistics.median(seconds) / test.n_tokens * 1000
            yield Result(config, "tg", test.name, test.n_tokens, test.depth, samples, tpot_ms=tpot_ms, ref=ref,
                         compared=ref is not None)


def _quality(plan: Plan, config: ConfigRun, status: Status, notice: Status) -> Result:
    chunk = config.settings.ctx or QUALITY_CTX
    engine, strategy = _load(config, chunk, status, notice)
    try:
        status(f"{config.model}: perplexity, chunks of {chunk} tokens")
        result = perplexity(engine, text_path().read_text(encoding="utf-8"), chunk)
    finally:
        strategy.close()
        engine.close()
    ref_ppl = None
    if plan.llama_bench is not None:
        exe = find_llama_perplexity(plan.llama_bench)
        if exe is None:
            notice(f"llama-perplexity not found next to {plan.llama_bench}: no reference perplexity ({BUILD_SCRIPT} builds both)")
        else:
            status(f"{config.model}: perplexity, llama-perplexity")
            ref_ppl = run_llama_perplexity(exe, config.path, text_path(), chunk, config.settings)[0]
    return Result(config, "ppl", f"ppl@c{chunk}", result.n_scored, 0, [chunk * result.n_chunks / result.seconds],
                  ppl=result, ref_ppl=ref_ppl, compared=plan.llama_bench is not None)


def _summary(samples: list[float]) -> Optional[dict[str, float]]:
    if not samples:
        return None
    std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return {"mean_ts": statistics.fmean(samples), "std_ts": std, "median_ts": statistics.median(samples)}


REF_NOISY = 0.20  # a reference whose repetitions spread more than this (std / mean) gives no verdict


def run_llama_bench(exe: Path, config: ConfigRun, test: Test, reps: int) -> dict[str, float]:
    s = config.settings
    p, n = (test.n_tokens, 0) if test.kind == "pp" else (0, test.n_tokens)
    cmd = [str(exe), "-m", str(config.path), "-p", str(p), "-n", str(n), "-d", str(test.depth), "-b", str(s.batch),
           "-ub", str(s.batch), *s.llama_args(), "-r", str(reps), "-o", "json"]
    out = _run_tool(cmd, "llama-bench")
    try:
        row = json.loads(out.stdout)[0]
        samples = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
        return {"mean_ts": float(row["avg_ts"]), "std_ts": float(row["stddev_ts"]), "median_ts": statistics.median(samples)}
    except (ValueError, LookupError, TypeError):
        raise EngineError(f"llama-bench printed no result for {test.name}: run `{' '.join(cmd)}` to see why") from None


_FINAL_PPL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")


def run_llama_perplexity(exe: Path, model: Path, text: Path, n_ctx: int, settings: Settings,
                         max_chunks: Optional[int] = None) -> tuple[float, float]:
    """llama.cpp's own perplexity on the same text and chunk size: (PPL, its +/-)."""
    # -b n_ctx: one chunk per batch, as ours (a bigger batch packs several chunks; same result, more memory).
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx), *settings.llama_args()]
    if max_chunks is not None:
        cmd += ["--chunks", str(max_chunks)]
    out = _run_tool(cmd, "llama-perplexity")
    m = _FINAL_PPL.search(out.stdout + out.stderr)
    if not m:
        raise EngineError(f"llama-perplexity printed no final estimate: run `{' '.join(cmd)}` to see why")
    return float(m.group(1)), float(m.group(2))


def _run_tool(cmd: list[str], name: str) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise EngineError(f"cannot run {name} ({cmd[0]}): {exc.strerror}") from None
    if out.returncode != 0:
        lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        raise EngineError(f"{name} failed (exit {out.returncode}): {lines[-1] if lines else 'no message'}")
    return out


# -- output -------------------------------------------------------------------------------------------


def rows_of(results: Sequence[Result]) -> list[dict[str, Any]]:
    """The rows, each perplexity also as a ratio to the lowest of the run (1.0: the best quant)."""
    rows = [r.as_row() for r in results]
    best = min((r["ppl"] for r in rows if r["kind"] == "ppl"), default=None)
    for r in rows:
        if r["kind"] == "ppl" and best:
            r["ppl_ratio"] = round(r["ppl"] / best, 4)
    return rows
