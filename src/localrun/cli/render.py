"""Terminal output: the response stream as text or JSON Lines on stdout, everything else on stderr, and the
one table that turns an exception into one line and an exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, Optional

from ..console import debug_enabled, err


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _json_out(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def reader_gone() -> None:
    """stdout's reader went away (`| head`): stop quietly with success, as `cat` and `yes` do."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
    except OSError:
        pass
    raise SystemExit(0)


def stream_answer(responses: Iterable, as_json: bool, verbose: bool, hide_thinking: bool = False, limit_unasked: bool = False,
                  threads: Optional[int] = None):
    """Write the answer to stdout as it comes (flushed per token); return the last response. A reasoning
    model's thinking goes to stderr (dimmed on a terminal), or as `thinking` events with --json; none of it
    with `hide_thinking`. `limit_unasked`: the user gave no --max-tokens, so an answer cut at the default
    limit says so on stderr (Ollama and llama-cli generate until the end by default)."""
    try:
        return _stream_answer(responses, as_json, verbose, hide_thinking, limit_unasked, threads)
    except BrokenPipeError:
        reader_gone()


class ThinkingWriter:
    """A reasoning model's thinking on stderr, dimmed on a terminal, ended by a blank line before the answer."""

    def __init__(self):
        self.stream = sys.stderr
        self.dim = self.stream.isatty()
        self.open = False
        self.last = ""

    def write(self, text: str) -> None:
        if not text:
            return
        if self.dim and not self.open:
            self.stream.write("\x1b[2m")
        self.open = True
        self.stream.write(text)
        self.stream.flush()
        self.last = text

    def end(self) -> None:
        if self.open:
            self.stream.write(("\x1b[0m" if self.dim else "") + ("" if self.last.endswith("\n") else "\n") + "\n")
            self.stream.flush()
            self.open = False


SHOWN_FROM = 256  # prompt tokens left to read (past the cached part) from which the reading is shown: a short prompt
# read in several parts (text, an image, text) is over before a line could be read


class PromptProgress:
    """How far a long prompt's evaluation is, while the answer waits for it: one line on stderr at a terminal (the
    tokens read of the total, those that came from a cache, the rate), redrawn with each chunk and erased when the
    answer begins. A prompt read in one go shows nothing; nothing is shown where stderr is no terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()
        self.drawn = False
        self.parts = 0  # --json's progress events written (a prompt read in parts)
        self.since: Optional[tuple[float, int]] = None  # (when, tokens in) at the first progress heard: the rate counts from it

    def show(self, progress) -> None:
        if not self.on:
            return
        import shutil
        import time

        now = time.monotonic()
        if self.since is None:
            self.since = (now, progress.processed)
        if not self.drawn and (progress.processed >= progress.total or progress.total - progress.cached < SHOWN_FROM):
            return  # read in one go (or all of it from a cache), or too little to read to wait for
        line = f"reading the prompt: {progress.processed:,} of {progress.total:,} tokens"
        if progress.cached:
            line += f" ({progress.cached:,} from the cache)"
        read, seconds = progress.processed - self.since[1], now - self.since[0]
        if read > 0 and seconds > 0:
            line += f", {read / seconds:,.0f} tokens/s"
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.stream.write("\r\x1b[2K\x1b[2m" + line[:width] + "\x1b[0m")
        self.stream.flush()
        self.drawn = True

    def end(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.drawn = False


def progress_event(progress) -> dict:
    """--json's event for a prompt's progress (engine.Progress)."""
    return {"type": "progress", "total": progress.total, "cached": progress.cached, "processed": progress.processed}


def _stream_answer(responses: Iterable, as_json: bool, verbose: bool, hide_thinking: bool = False, limit_unasked: bool = False,
                   threads: Optional[int] = None):
    progress = PromptProgress()
    try:
        return _answer_lines(responses, as_json, verbose, hide_thinking, limit_unasked, threads, progress)
    finally:
        progress.end()  # an answer that failed before its first word: the line goes


def _answer_lines(responses: Iterable, as_json: bool, verbose: bool, hide_thinking: bool, limit_unasked: bool,
                  threads: Optional[int], progress: PromptProgress):
    out = sys.stdout
    final = None
    wrote_any = False
    shown: list[str] = []
    thought: list[str] = []
    tokens: list[int] = []
    thinking = ThinkingWriter()
    try:
        for response in responses:
            tokens.extend(response.tokens)
            if response.progress is not None:
                if as_json:
                    # a prompt read in parts: each part an event; one read in one go (a short prompt) none, so that a
                    # script reading tokens sees only tokens then done, as before progress was reported
                    if progress.parts or response.progress.processed < response.progress.total:
                        progress.parts += 1
                        out.write(json.dumps(progress_event(response.progress)) + "\n")
                        out.flush()
                else:
                    progress.show(response.progress)
            if response.thinking or response.text or response.done:
                progress.end()
            if response.thinking:
                thought.append(response.thinking)
                if as_json and not hide_thinking:
                    out.write(json.dumps({"type": "thinking", "text": response.thinking}, ensure_ascii=False) + "\n")
                    out.flush()
                elif not hide_thinking:
                    thinking.write(response.thinking)
            if response.text:
                thinking.end()
            if response.text:
                shown.append(response.text)
                if as_json:
                    out.write(json.dumps({"type": "token", "text": response.text}, ensure_ascii=False) + "\n")
                else:
                    out.write(response.text)
                    wrote_any = True
                out.flush()
            if response.done:
                final = response
    except KeyboardInterrupt:
        progress.end()
        thinking.end()
        if as_json:  # a JSON Lines reader still gets its last event (then exit 130 as usual)
            out.write(json.dumps({"type": "done", "text": "".join(shown), "stats": {"finish_reason": "interrupted"}}) + "\n")
            out.flush()
        elif wrote_any and not "".join(shown).endswith("\n"):  # ended as a whole answer is: the shell's prompt on a line of its own
            out.write("\n")
            out.flush()
        raise
    thinking.end()
    if final is not None and thought and not "".join(shown).strip() and final.finish_reason in ("length", "eos"):
        from ..console import warn

        if final.finish_reason == "length":
            warn(f"the answer was cut inside the model's thinking, after {final.stats.generated_tokens} tokens: raise --max-tokens"
                 " (thinking counts toward it)")
        else:
            warn("the model ended inside its thinking and gave no answer: ask again, or try --no-think")
    elif final is not None and limit_unasked and final.finish_reason == "length" and not final.context_full:
        from ..console import notice

        notice(f"the answer stopped at the default limit of {final.stats.generated_tokens} tokens: -n N for more, -n -1 for no limit")
    if final is not None:
        text = "".join(shown)
        if as_json:
            out.write(json.dumps({"type": "done", "text": text, "tokens": tokens, "stats": final.stats.as_dict()}, ensure_ascii=False) + "\n")
        elif wrote_any and not text.endswith("\n"):
            out.write("\n")
        out.flush()
        if verbose:
            stats(final.stats, threads)
    return final


def stats(s, threads: Optional[int] = None) -> None:
    """Ollama-style timing lines on stderr, and the CPU threads that decoded the answer (`threads`, else what the
    background server sent beside the stats)."""
    threads = threads or getattr(s, "threads", None)
    rows = [
        ("load duration", f"{s.load_s * 1000:.1f} ms"),
        ("prompt eval count", f"{s.prompt_eval_tokens} token(s)" + (f" ({s.cached_tokens} cached)" if s.cached_tokens else "")),
        ("prompt eval duration", f"{s.prompt_eval_s * 1000:.1f} ms"),
        ("prompt eval rate", f"{s.prompt_rate:.2f} tokens/s"),
        ("eval count", f"{s.generated_tokens} token(s)"),  # Ollama's: the answer's tokens (the rate: after the first)
        ("eval duration", f"{s.eval_s * 1000:.1f} ms"),
        ("eval rate", f"{s.eval_rate:.2f} tokens/s"),
        ("time to first token", f"{s.ttft_s * 1000:.1f} ms"),
        ("time per output token", f"{s.tpot_s * 1000:.2f} ms"),
        ("finish reason", s.finish_reason),
        *([("threads", f"{threads} (--threads)")] if threads else []),
    ]
    if s.thinking_tokens:
        rows.insert(5, ("thinking tokens", f"{s.thinking_tokens} of {s.generated_tokens}"))
    if s.target_steps:  # speculative decoding or beam search
        rows.insert(-1, ("target steps", f"{s.target_steps} ({(s.eval_tokens + 1) / s.target_steps:.2f} tokens per step)"))
        if s.draft_tokens:
            rows.insert(-1, ("draft acceptance", f"{s.draft_accepted}/{s.draft_tokens} ({s.acceptance_rate:.1%})"))
    for k, v in rows:
        err.print(f"[dim]{k + ':':<24}[/dim]{v}", highlight=False)


def local_models_table(models: list, as_json: bool) -> None:
    if as_json:
        _json_out([m.to_record() for m in models])
        return
    if not models:
        err.print("no models pulled yet: try `localrun pull smollm2`")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "QUANT", "SIZE", "SOURCE", "PATH"):
        table.add_column(col)
    for m in models:
        table.add_row(m.name, m.quant or _file_quant(m.path), human_size(m.size), m.source, str(m.path))
    _print_table(table)


def _file_quant(path) -> str:
    """The quant of a model's file, read from its header (a created model's name carries none)."""
    from ..runtime import read_info
    from ..errors import LocalrunError

    try:
        return read_info(path).quant
    except LocalrunError:  # missing or broken: `run` says what is wrong with it
        return ""


def loaded_models(models: list[dict], as_json: bool) -> None:
    """`localrun ps`: what the server holds, as Ollama's `ps` shows it, plus the slots."""
    if as_json:
        _json_out(models)
        return
    if not models:
        err.print("no model is loaded")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "SIZE", "PROCESSOR", "THREADS", "CONTEXT", "SLOTS BUSY", "UNTIL", "SIZE IS"):
        table.add_column(col)
    for m in models:
        if m.get("loading"):
            until = f"loading {m['loading']['progress']:.0%} ({m['loading']['seconds']:.0f} s)"
        else:
            until = "in use" if m["requests"] else until_text(m["expires_at"], m.get("keep_alive", 0))
        table.add_row(m["name"], human_size(m["size"]), m["processor"], str(m.get("threads") or "-"), str(m["context_length"] or "-"),
                      f"{m['slots_busy']}/{m['slots']}", until, memory_parts(m.get("memory") or {}))
    _print_table(table)


def until_text(expires_at: Optional[str], keep_alive: Optional[float], now: Optional[float] = None) -> str:
    """ps's UNTIL as Ollama's ps writes it: "4 minutes from now", "Forever" for a model kept until stopped (its
    expires_at is the far future, as Ollama's), "Stopping..." once past; --json keeps the timestamp."""
    import time
    from datetime import datetime

    if keep_alive is None or not expires_at:  # keep-alive -1
        return "Forever"
    delta = datetime.fromisoformat(expires_at).timestamp() - (time.time() if now is None else now)
    if delta <= 0:
        return "Stopping..."
    if delta > 20 * 365 * 86400:
        return "Forever"
    return f"{human_duration(delta)} from now"


def human_duration(seconds: float) -> str:
    """A duration in words, as Ollama's format.HumanDuration says it ("About a minute", "4 minutes", "2 hours")."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds // 3600) // 24 // 365} years"


def catalogue_table(cat, as_json: bool) -> None:
    if as_json:
        _json_out({alias: e.model_dump() for alias, e in cat.models.items()})
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("ALIAS", "REPO", "QUANTS", "DEFAULT", "MIRROR", "DESCRIPTION"):
        table.add_column(col)
    for alias, e in cat.models.items():
        name = alias + (" *" if alias == cat.default else "")
        table.add_row(name, e.repo, " ".join(e.quants), e.default_quant, " ".join(e.mirror) or "-", e.description or "")
    _print_table(table)


def model_details(details: dict, as_json: bool) -> None:
    if details.get("context_capped"):
        from ..console import notice

        notice(details["context_capped"])
    if as_json:
        _json_out(details)
        return
    est = details["memory_estimate"]
    rows = [
        ("name", details["name"]),
        ("architecture", details["architecture"]),
        ("parameters", f"{details['parameters'] / 1e6:.1f} M"),
        ("quant", details["quant"]),
        ("context length", f"{details['context_length']} (trained)"),
        ("layers / heads / kv heads", f"{details['n_layer']} / {details['n_head']} / {details['n_kv_head']}"),
        ("head dim", str(details["head_dim"])),
        ("sliding window", str(details["sliding_window"] or "none")),
        ("chat template", "yes" if details["chat_template"] else "no (base model: completion only)"),
        *([("vision", f"yes: projector {details['projector']}")] if details.get("projector") else []),
        *([("drafts", f"{details['draft']} by default (--draft none turns it off; a request's draft_max 0 too)")]
          if details.get("draft") else []),
        *[(f"LoRA adapter {i}", f"{a['path']} at scale {a['scale']:g}" + ("" if a.get("present", True) else " (missing: the file is gone)"))
          for i, a in enumerate(details.get("adapters") or [])],
        ("file size", human_size(details["file_size"])),
        ("sha256", details["sha256"] + (" (hashed now)" if details.get("sha256_checked") == "now" else
                                        f" (from the {'create' if details['source'] == 'created' else 'pull'}; size and mtime"
                                        " unchanged since: --verify hashes it)")),
        ("source", details["source"]),
        ("path", details["path"]),
        (f"memory at ctx {est['n_ctx']} ({est['kv_type']})", f"{memory_breakdown(est)} (estimate)"),
    ]
    served = details.get("memory_served")
    if served:  # what `ps` will show once run or chat loads it in the background server
        rows.append((f"served, {served['slots']} slots", f"{memory_breakdown(served)} (estimate: the background server's, as `ps` shows)"))
    if "memory_allocated" in details:
        rows.append(("llama.cpp allocated", memory_breakdown(details["memory_allocated"])))
    for place in details.get("placement", []):
        rows.append((f"on {place['device']}", f"{place['n_layers']} layer(s) ({place['layers']}): weights {human_size(place['weights_bytes'])}"
                     f" + KV {human_size(place['kv_bytes'])}"))
    _kv_rows(rows)


def memory_parts(m: dict) -> str:
    """'weights 1.1 GB + repacked copy 626 MB + KV 117 MB + compute 72 MB': what a memory figure is made of (the
    repacked copy: the weights llama.cpp's CPU backend lays out again for its kernels, beside the mapped file)."""
    parts = [("weights", "weights_bytes"), ("repacked copy", "repacked_bytes"), ("KV", "kv_bytes"), ("compute", "compute_bytes")]
    return " + ".join(f"{label} {human_size(m[key])}" for label, key in parts
                      if m.get(key) or (key in ("weights_bytes", "kv_bytes") and key in m))


def memory_breakdown(m: dict) -> str:
    """memory_parts(m) = the total."""
    return f"{memory_parts(m)} = {human_size(m['total_bytes'])}"


def doctor(report: dict, as_json: bool) -> None:
    if as_json:
        _json_out(report)
        return
    rows = [(_doctor_label(k), _doctor_value(k, v)) for k, v in report.items() if k != "rpc_workers"]
    for w in report.get("rpc_workers", []):
        if "error" in w:
            rows.append((f"rpc {w['endpoint']}", f"not usable: {w['error']}"))
            continue
        devices = "; ".join(f"{d['name']} {human_size(d['free'])} free of {human_size(d['total'])}" for d in w["devices"])
        rows.append((f"rpc {w['endpoint']}", f"protocol {w['protocol']}, {len(w['devices'])} device(s): {devices}"))
    _kv_rows(rows)


def _doctor_label(key: str) -> str:
    """A report key as doctor's label: free_disk_bytes is "free disk" (its value says the unit)."""
    return key.removesuffix("_bytes").replace("_", " ")


def _doctor_value(key: str, value: Any) -> str:
    """A report value as doctor prints it: sizes in words, lists one after another, yes or no (--json keeps them)."""
    if key == "threads" and isinstance(value, dict):
        return (f"{value['default']} by default, a thread per physical core ({value['physical_cores']} cores, "
                f"{value['logical_cpus']} logical CPUs here; --threads N)")
    if key == "cpu_busy_elsewhere":
        return "unknown (no /proc here)" if value is None else f"{value:.1f} cores used by other processes now"
    if key == "cpu_advice":
        return value or "none: the cores are free enough"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return human_size(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _kv_rows(rows) -> None:
    width = max(len(k) for k, _ in rows) + 2
    out = sys.stdout
    for k, v in rows:
        out.write(f"{k + ':':<{width}}{v}\n")
    out.flush()


def _print_table(table) -> None:
    from rich.console import Console

    # In a pipe nothing is cut to fit a terminal's width: scripts get whole paths.
    width = None if sys.stdout.isatty() else 100_000
    Console(file=sys.stdout, highlight=False, soft_wrap=True, emoji=False, width=width).print(table)


def sessions_table(entries: list, as_json: bool) -> None:
    if as_json:
        _json_out([{k: v for k, v in e.as_dict().items() if k != "messages"} for e in entries])
        return
    if not entries:
        err.print("no sessions yet: `localrun chat MODEL --session NAME` or `localrun run MODEL --session NAME ...`")
        return
    import datetime

    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "MODEL", "TOKENS", "SIZE", "LAST USED"):
        table.add_column(col)
    for e in entries:
        when = datetime.datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M")
        table.add_row(e.name or "(prefix)", e.model, str(e.tokens), human_size(e.size), when)
    _print_table(table)


def session_details(info, as_json: bool) -> None:
    if as_json:
        _json_out(info.as_dict())
        return
    rows = [
        ("name", info.name), ("model", f"{info.model} ({info.quant})"), ("tokens", str(info.tokens)),
        ("context", f"{info.n_ctx} ({info.kv_type})"), ("size", human_size(info.size)), ("build", info.build),
    ]
    if getattr(info, "adapters", ""):  # made under LoRA adapters: each file's sha256 (shortened) and scale
        rows.append(("LoRA adapters", ", ".join(f"{sha[:12]} at scale {scale}" for sha, _, scale in
                                                (part.partition("@") for part in info.adapters.split(",")))))
    _kv_rows(rows)
    out = sys.stdout
    for m in info.messages:
        out.write(f"\n[{m['role']}]\n{m['content']}\n")
    out.flush()


# -- errors ------------------------------------------------------------------------------------------


def _message_for(exc: BaseException) -> tuple[str, int]:
    from .failures import message_for

    return message_for(exc)


def render_error(exc: BaseException) -> int:
    """Print `exc` as one line on stderr and return the exit code to use."""
    message, code = _message_for(exc)
    if debug_enabled() and not isinstance(exc, KeyboardInterrupt):
        err.print_exception()
    # The message is user data (paths, prompts): print it without markup interpretation.
    err.print("[error]error:[/error] ", end="")
    err.print(message, markup=False, highlight=False)
    return code
