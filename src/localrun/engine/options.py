"""The one list of sampling options, as plain data: each option's name, type, default, bounds and help, and
how the command line and the chat's /set take it. The CLI builds its flags from it without importing
pydantic or llama.cpp; sampling.py builds the validated SamplingOptions model from it. A new option is one
entry here and its place in the sampler chain (sampling.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import Phrase, SettingError, UsageError


@dataclass(frozen=True)
class Option:
    name: str
    type: Any  # float, int, Optional[int], list[str], dict[int, float], Optional[str] ...
    default: Any  # a value; list or dict: an empty one
    description: str
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    short: tuple[str, ...] = ()  # short flags
    help: Optional[str] = None  # for --help, where shorter than the description
    file: bool = False  # the command line names a file to read (a grammar, a JSON schema)
    pairs: bool = False  # the command line gives TOKEN=VALUE pairs (repeatable)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def is_list(self) -> bool:
        return getattr(self.type, "__origin__", None) is list


MIN_CONTEXT = 16  # the fewest tokens a context (a slot's, on a server) may hold (--ctx, options.num_ctx)
KV_TYPES = ("f16", "q8_0", "q4_0")  # the KV cache types a context takes (--kv-type, options.kv_type)
DRAFT_MAX = 64  # the most tokens a step may draft (--draft-max; a request's draft_max)
# --draft-max by default. A lookup draft is long only behind a long match (a run being copied), where a CPU's
# batched step pays more the longer it is (Qwen2.5-1.5B, 2 threads, AMD EPYC, flash attention off as drafting
# sets it: 16 tokens cost 6.9 single steps, 32 cost 11.9, 48 cost 16.5: scripts/bench_verify_cost.py), and the
# code edit of scripts/bench_edit.py decoded 1.71x plain at 16, 1.98x at 32, 1.90x at 48 (steps of 17, 33, 49
# tokens), 2.11x at 32 once a CPU's step was cut to whole fours (engine.strategies.CPU_ROWS: 31 drafted). A
# draft model's every token costs a decode of its own: 16.
LOOKUP_DRAFT_MAX, MODEL_DRAFT_MAX = 32, 16


def check_context(n_ctx: int) -> None:
    if n_ctx < MIN_CONTEXT:
        raise SettingError("ctx", n_ctx, f"the context must hold at least {MIN_CONTEXT} tokens")


# Defaults follow llama.cpp's own (common/common.h).
SAMPLING: tuple[Option, ...] = (
    Option("temperature", float, 0.8, "0 means greedy (always the most likely token)", ge=0.0, le=5.0, short=("-t", "--temp"), help="0 = greedy"),
    Option("top_k", int, 40, "keep the k most likely tokens; 0 disables", ge=0, le=1_000_000),
    Option("top_p", float, 0.95, "nucleus sampling; 1.0 disables", gt=0.0, le=1.0),
    Option("min_p", float, 0.05, "drop tokens below min_p x the best probability; 0 disables", ge=0.0, le=1.0),
    Option("typical_p", float, 1.0, "locally typical sampling; 1.0 disables", gt=0.0, le=1.0),
    Option("repeat_penalty", float, 1.0, "penalise repeated tokens; 1.0 disables", ge=0.0, le=10.0),
    Option("repeat_last_n", int, 64, "how many recent tokens the penalties see; -1 = context", ge=-1, le=1_000_000),
    Option("presence_penalty", float, 0.0, "penalise tokens already present; 0 disables", ge=-2.0, le=2.0),
    Option("frequency_penalty", float, 0.0, "penalise tokens by their count so far; 0 disables", ge=-2.0, le=2.0),
    Option("dry_multiplier", float, 0.0, "DRY: penalise tokens that extend a sequence seen before; 0 disables", ge=0.0, le=100.0),
    Option("dry_base", float, 1.75, "DRY: the penalty grows as multiplier x base^(length - allowed length)", ge=1.0, le=10.0),
    Option("dry_allowed_length", int, 2, "DRY: repeats up to this many tokens go unpenalised", ge=0, le=1000),
    Option("dry_penalty_last_n", int, 64, "DRY: how many recent tokens it scans; -1 = context, 0 disables", ge=-1, le=1_000_000),
    Option("dry_sequence_breaker", list[str], ["\n", ":", "\"", "*"], "DRY: text that ends a repeated sequence (repeatable)"),
    Option("xtc_probability", float, 0.0, "XTC: chance per token of excluding the top choices; 0 disables", ge=0.0, le=1.0),
    Option("xtc_threshold", float, 0.1, "XTC: tokens above this probability are the top choices; over 0.5 disables", ge=0.0, le=1.0),
    Option("mirostat", int, 0, "0 off, 1 Mirostat, 2 Mirostat 2.0", ge=0, le=2),
    Option("mirostat_tau", float, 5.0, "Mirostat target entropy", gt=0.0, le=20.0),
    Option("mirostat_eta", float, 0.1, "Mirostat learning rate", gt=0.0, le=1.0),
    Option("seed", Optional[int], None, "fixed seed: same seed, same output; -1 = random (as llama.cpp and Ollama take it)", ge=-1, le=2**32 - 2),
    Option("max_tokens", int, 512, "most tokens to generate (default 512; -1 or -2: until the context is full)", ge=-2, le=10_000_000, short=("-n",)),
    Option("min_tokens", int, 0, "end-of-generation is suppressed until this many", ge=0, le=10_000_000,
           help="suppress end-of-text until this many"),
    Option("reasoning_budget", Optional[int], None, "most tokens a reasoning model thinks before its answer: then its own "
           "end-of-thinking marker is written and the answer begins (llama.cpp's reasoning budget); -1 or unset: no limit, "
           "0: no thinking", ge=-1, le=10_000_000, help="most tokens of thinking (-1: no limit)"),
    Option("logit_bias", dict[int, float], {}, "token id -> added logit", pairs=True, help="TOKEN_ID=BIAS (repeatable)"),
    Option("stop", list[str], [], "stop sequence (repeatable)", short=("-s",)),
    Option("grammar", Optional[str], None, "GBNF grammar text", file=True, help="GBNF grammar file"),
    Option("json_schema", Optional[dict[str, Any]], None, "constrain output to this JSON schema", file=True,
           short=("--format",), help="JSON schema for the output: a file, inline JSON, or json (any JSON object, "
                                     "as Ollama's --format json)"),
)
BY_NAME = {o.name: o for o in SAMPLING}


def cli_value(name: str, raw: Any) -> Any:
    """A flag's value as the option takes it: TOKEN=VALUE pairs parsed, a file read; None: not given."""
    if raw is None or (isinstance(raw, list) and not raw):
        return None
    option = BY_NAME[name]
    if option.pairs:
        return parse_logit_bias(list(raw))
    if option.file:
        return _FILE_READERS[name](raw if name == "json_schema" else Path(raw))  # a schema may be inline JSON
    return raw


def text_value(name: str, text: str) -> Any:
    """What `/set NAME TEXT` sets: lists split like a shell line, pairs and files as on the command line,
    none/null/off/- for 'none' (and 'random' for the seed). ValueError for an unknown name or unclosed quote."""
    import shlex

    option = BY_NAME.get(name)
    if option is None:
        raise ValueError(f"unknown parameter {name!r}: one of {', '.join(BY_NAME)}")
    empty = text.lower() in ("none", "null", "off", "-")
    if option.is_list:
        return [] if empty else shlex.split(text)
    if option.pairs:
        return {} if empty else parse_logit_bias(text.split())
    if option.file:
        return None if empty else _FILE_READERS[name](text if name == "json_schema" else Path(text).expanduser())
    if name == "seed" and (empty or text.lower() == "random"):
        return None
    return text


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """`TOKEN=BIAS` pairs; TOKEN is a token id. -inf bans a token (SamplingOptions refuses +inf and NaN)."""
    out: dict[int, float] = {}
    for item in items:
        tok, sep, bias = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(tok)] = float(bias)
        except ValueError:
            raise SettingError("logit_bias", item, "use TOKEN_ID=BIAS, e.g. 2=-100") from None
    return out


def read_grammar(path: Optional[Path]) -> Optional[str]:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(Phrase("cannot read {grammar} {path}: {why}", path=path, why=exc.strerror)) from None
    except UnicodeDecodeError:
        raise UsageError(Phrase("{grammar} {path} is not a UTF-8 text file: give a GBNF grammar", path=path)) from None


def read_json_schema(given: Optional[Union[str, Path]]) -> Optional[dict[str, Any]]:
    """A JSON schema: given inline (text starting with `{`, read as written: no path of it is made), `json` for
    any JSON object (Ollama's format "json", where no file has that name), or the path of a file holding one."""
    if given is None:
        return None
    text = given.strip() if isinstance(given, str) else str(given)
    path = Path(text).expanduser() if not text.startswith("{") else None
    if text == "json" and not path.is_file():
        return {"type": "object"}
    shown = "(inline)" if path is None else str(path)
    try:
        data = json.loads(text) if path is None else json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(Phrase("cannot read {json_schema} {shown}: {why}", shown=shown, why=exc.strerror)) from None
    except UnicodeDecodeError:
        raise UsageError(Phrase("{json_schema} {shown} is not a UTF-8 text file: give a JSON schema", shown=shown)) from None
    except json.JSONDecodeError as exc:
        raise UsageError(Phrase("{json_schema} {shown} is not valid JSON (line {line}: {why})", shown=shown, line=exc.lineno,
                                why=exc.msg)) from None
    if not isinstance(data, dict):
        raise UsageError(Phrase("{json_schema} {shown} must hold a JSON object (a schema)", shown=shown))
    return data


_FILE_READERS = {"grammar": read_grammar, "json_schema": read_json_schema}
