"""`localrun bench --serve URL`: load-test an OpenAI-compatible endpoint with N concurrent streams.

Each level of concurrency runs its requests (streaming completions of a fixed length, `ignore_eos`
so every request decodes the same number of tokens) from that many client threads, and reports
aggregate decode throughput, request rate, TTFT and TPOT percentiles and failures. The first level
is the reference: every other level also gets its throughput as a ratio to it (e.g. 8 streams vs 1).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import UsageError


@dataclass
class Outcome:
    ok: bool
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens: int = 0
    error: str = ""


@dataclass
class Level:
    concurrency: int
    requests: int
    wall_s: float
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.ok)

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def row(self, reference: Optional["Level"]) -> dict[str, Any]:
        ttft = sorted(o.ttft_s for o in self.ok)
        tpot = sorted(o.tpot_s for o in self.ok if o.tpot_s > 0)
        errors = sorted({o.error for o in self.outcomes if not o.ok})
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "failed": self.requests - len(self.ok),
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.throughput, 2),
            "requests_per_s": round(len(self.ok) / self.wall_s, 3) if self.wall_s > 0 else 0.0,
            "ttft_p50_s": _pct(ttft, 50),
            "ttft_p95_s": _pct(ttft, 95),
            "tpot_p50_s": _pct(tpot, 50),
            "tpot_p95_s": _pct(tpot, 95),
            "speedup_vs_first": round(self.throughput / reference.throughput, 3) if reference and reference.throughput else None,
            "errors": errors[:3],
        }


def _pct(values: list[float], p: int) -> Optional[float]:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1], 4)


def stream_once(client, url: str, body: dict, headers: dict) -> Outcome:
    """One streaming completion, timed from the request to the first text and to the end."""
    t0 = time.perf_counter()
    first: Optional[float] = None
    tokens = chunks = 0
    done = False
    try:
        with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                return Outcome(False, error=f"HTTP {r.status_code}: {_error_message(r.text)}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return Outcome(False, error=str(event["error"].get("message")))
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event["choices"] and event["choices"][0].get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - any transport failure is a failed request, counted, not fatal
        return Outcome(False, error=f"{type(exc).__name__}: {exc}")
    if not done:
        return Outcome(False, error="the stream ended before [DONE]")
    tokens = tokens or chunks  # a server that ignores include_usage: count the text chunks
    end = time.perf_counter()
    if first is None:
        first = end
    return Outcome(True, ttft_s=first - t0, tpot_s=(end - first) / (tokens - 1) if tokens > 1 else 0.0, tokens=tokens)


def _error_message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except Exception:  # noqa: BLE001 - not an OpenAI-style error body
        return text[:200]


def run_level(base_url: str, concurrency: int, requests: int, *, prompt: str, max_tokens: int,
              api_key: Optional[str], model: str, progress: Callable[[int], None] = lambda _: None) -> Level:
    import httpx

    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    with httpx.Client(timeout=httpx.Timeout(600, connect=10), limits=limits) as client:
        def one(i: int) -> None:
            outcome = stream_once(client, url, body, headers)
            with lock:
                outcomes.append(outcome)
                progress(len(outcomes))

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(requests)))
        wall = time.perf_counter() - t0
    return Level(concurrency, requests, wall, outcomes)


def check_endpoint(base_url: str, api_key: Optional[str]) -> str:
    """The served model's id, or a one-line error naming the URL and what went wrong."""
    import httpx

    if not base_url.startswith(("http://", "https://")):
        raise UsageError(f"invalid --serve {base_url!r}: give the API's base URL, e.g. http://127.0.0.1:11435/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise UsageError(f"cannot reach {base_url}: {exc}: start the server (`localrun serve MODEL`) or fix --serve") from None
    if r.status_code == 401:
        raise UsageError(f"{base_url} wants an API key: pass --api-key (or set LOCALRUN_API_KEY)")
    if r.status_code != 200:
        raise UsageError(f"{base_url}/models answered HTTP {r.status_code}: is this an OpenAI-compatible API's /v1 URL?")
    try:
        data = r.json().get("data") or [{}]
        return data[0].get("id", "default")
    except (ValueError, AttributeError, IndexError, TypeError):
        raise UsageError(f"{base_url}/models did not answer an OpenAI model list: is this an OpenAI-compatible API's /v1 URL?") from None


def filler_prompt(n_words: int) -> str:
    words = "the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees".split()
    return " ".join(words[i % len(words)] for i in range(max(1, n_words)))


def run_from_cli(url: str, *, concurrency: str, requests: Optional[int], tg: str, pp: str, output: str,
                 api_key: Optional[str]) -> int:
    from ..console import StatusLine, err
    from ..runtime.reports.bench import OUTPUTS, _ints

    levels = _ints("--concurrency", concurrency, 1)
    max_tokens = _ints("--tg", tg, 1)[0]
    prompt_words = _ints("--pp", pp, 1)[0]
    if output not in OUTPUTS:
        raise UsageError(f"invalid --output {output!r}: use one of {', '.join(OUTPUTS)}")
    if requests is not None and requests < 1:
        raise UsageError(f"invalid --requests {requests}: use 1 or more")
    model = check_endpoint(url, api_key)
    prompt = filler_prompt(prompt_words)
    rows: list[dict] = []
    reference: Optional[Level] = None
    try:
        for c in levels:
            n = requests if requests is not None else 4 * c
            with StatusLine(f"{c} concurrent streams: 0/{n} requests") as spinner:  # no redraw thread beside the server
                level = run_level(url, c, n, prompt=prompt, max_tokens=max_tokens, api_key=api_key, model=model,
                                  progress=lambda k, c=c, n=n: spinner.update(f"{c} concurrent streams: {k}/{n} requests"))
            reference = reference or level
            rows.append({"url": url, "model": model, "prompt_words": prompt_words, "max_tokens": max_tokens, **level.row(reference)})
            r = rows[-1]
            err.print(f"[dim]concurrency {c}: {r['tokens_per_s']} t/s, TTFT p50 {r['ttft_p50_s']} s, {r['failed']} failed[/dim]", highlight=False)
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(rows)} level(s) measured so far")
        _render(rows, output)
        return 130
    _render(rows, output)
    return 1 if any(r["failed"] for r in rows) else 0


_COLUMNS = [
    ("concurrency", "streams"), ("requests", "requests"), ("failed", "failed"), ("tokens_per_s", "t/s"),
    ("speedup_vs_first", "x first"), ("requests_per_s", "req/s"), ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p95_s", "TTFT p95 s"), ("tpot_p50_s", "TPOT p50 s"), ("tpot_p95_s", "TPOT p95 s"),
]


def _render(rows: list[dict], output: str) -> None:
    import csv
    import io
    import sys

    if output == "json":
        print(json.dumps(rows, indent=2))
        return
    if output == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=[k for k in rows[0] if k != "errors"] if rows else [], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
        return
    cells = [[("" if r[k] is None else str(r[k])) for k, _ in _COLUMNS] for r in rows]
    if output == "md":
        head = [h for _, h in _COLUMNS]
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---:" for _ in head) + "|")
        for c in cells:
            print("| " + " | ".join(c) + " |")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{rows[0]['model']} at {rows[0]['url']}" if rows else None)
    for _, h in _COLUMNS:
        table.add_column(h, justify="right")
    for c in cells:
        table.add_row(*c)
    # Full width when piped, as bench's own tables: Rich would cut cells to 80 columns.
    Console(file=sys.stdout, highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 240).print(table)
    for r in rows:
        for e in r["errors"]:
            print(f"concurrency {r['concurrency']}: {e}", file=sys.stderr)
