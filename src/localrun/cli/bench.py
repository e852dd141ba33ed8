"""`localrun bench`'s front-end: the measuring plan comes from runtime/reports/bench.py; this prints its results as
tables (stderr progress, stdout results), JSON, CSV or Markdown, and draws the plot."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ..errors import EXIT_INTERRUPTED
from ..runtime.reports.bench import REF_NOISY, SETTINGS, CSV_FIELDS, Result, make_plan, rows_of, run


def to_json(rows: Sequence[dict]) -> str:
    return json.dumps(list(rows), indent=2) + "\n"


def to_csv(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, **row["settings"]})
    return buf.getvalue()


def _varying(rows: Sequence[dict]) -> list[str]:
    return [k for k in SETTINGS if len({json.dumps(r["settings"][k]) for r in rows}) > 1]


def _settings_label(settings: dict, keys: Sequence[str]) -> str:
    short = {"threads": "t", "ctx": "ctx", "batch": "b", "kv_type": "kv", "gpu_layers": "ngl", "flash_attn": "fa", "decode": "decode"}
    return " ".join(f"{short[k]}={settings[k]}" for k in keys)


def _caption(rows: Sequence[dict]) -> str:
    fixed = [k for k in SETTINGS if k not in _varying(rows)]
    text = _settings_label(rows[0]["settings"], fixed) if fixed else ""
    reps = sorted({r["reps"] for r in rows if r["kind"] != "ppl"})
    timing = f"; reps {','.join(map(str, reps))} (mean ± sample std)" if reps else ""
    warning = ""
    if any(noisy(r) for r in rows):
        warning = (f"\n! llama-bench's own repetitions spread over {REF_NOISY:.0%} (std / mean): that ratio is no verdict,"
                   " measure again on a quieter machine or with more --reps")
    adapters = rows[0]["settings"].get("lora")
    lora = f"; LoRA {', '.join(adapters)}" if adapters else ""
    return f"{rows[0]['build']}; {text}{lora}{timing}{warning}"


def noisy(row: dict) -> bool:
    """A compared row whose reference spread too much for its ratio to mean anything."""
    return (row.get("ref_spread") or 0) > REF_NOISY


def _ts(row: dict) -> str:
    return f"{row['mean_ts']:.2f} ± {row['std_ts']:.2f}"


def _opt(x: Optional[float], fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def tables(rows: Sequence[dict]) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """Two tables as strings: speed tests (one row per test), then one row per model+settings."""
    from .render import human_size

    varying = _varying(rows)
    compared = any("ratio" in r or "ref_mean_ts" in r or "ref_ppl" in r for r in rows)
    head = ["model", *(["settings"] if varying else []), "test", "t/s", "median t/s"]
    head += ["llama.cpp t/s", "ratio"] if compared else []
    head += ["TPOT ms"]
    speed = []
    for r in rows:
        if r["kind"] == "ppl":
            continue
        cells = [r["model"], *([_settings_label(r["settings"], varying)] if varying else []), r["test"], _ts(r),
                 f"{r['median_ts']:.2f}"]
        if compared:
            ref = r.get("ref_mean_ts")
            flag = " !" if noisy(r) else ""
            cells += [f"{ref:.2f} ± {r['ref_std_ts']:.2f}" if ref else "-", _opt(r.get("ratio"), ".3f") + flag]
        cells.append(_opt(r["tpot_ms"], ".2f") if r["kind"] == "tg" else "")
        speed.append(cells)
    ttft_n = next((r["n_tokens"] for r in rows if r["kind"] == "pp"), None)
    has_ppl = any(r["kind"] == "ppl" for r in rows)
    mhead = ["model", *(["settings"] if varying else []), "load ms", f"TTFT ms (pp{ttft_n})" if ttft_n else "TTFT ms",
             "peak RSS", "KV cache", "GPU memory"]
    mhead += ["PPL", *(["llama.cpp PPL", "ratio"] if compared else [])] if has_ppl else []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model_path"], json.dumps(r["settings"], sort_keys=True)), []).append(r)
    models = []
    for group in groups.values():
        r = group[0]
        cells = [r["model"], *([_settings_label(r["settings"], varying)] if varying else []), f"{r['load_ms']:.0f}",
                 _opt(r["ttft_ms"], ".1f"), human_size(r["peak_rss_bytes"]), human_size(r["kv_bytes"]),
                 "n/a" if r["device_bytes"] is None else human_size(r["device_bytes"])]
        ppl = next((g for g in group if g["kind"] == "ppl"), None)
        if has_ppl:
            cells.append(f"{ppl['ppl']:.4f} ± {ppl['ppl_error']:.4f}" if ppl else "-")
            if compared:
                cells += [_opt(ppl.get("ref_ppl"), ".4f"), _opt(ppl.get("ratio"), ".4f")] if ppl else ["-", "-"]
        models.append(cells)
    return head, speed, mhead, models


def quality_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """One row per model (a quant) with a perplexity: size, memory at the context, speed, perplexity and its
    ratio to the best. Empty unless the run measured perplexity."""
    from .render import human_size

    varying = _varying(rows) if rows else []
    head = ["model", *(["settings"] if varying else []), "quant", "file", "memory", "pp t/s", "tg t/s", "PPL", "PPL / best"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model_path"], json.dumps(r["settings"], sort_keys=True)), []).append(r)
    body = []
    for group in groups.values():
        ppl = next((g for g in group if g["kind"] == "ppl"), None)
        if ppl is None:
            continue
        pp = next((g for g in group if g["kind"] == "pp"), None)
        tg = next((g for g in group if g["kind"] == "tg"), None)
        body.append([ppl["model"], *([_settings_label(ppl["settings"], varying)] if varying else []), ppl["quant"],
                     human_size(ppl["file_bytes"]), human_size(ppl["memory_bytes"]),
                     f"{pp['median_ts']:.2f}" if pp else "-", f"{tg['median_ts']:.2f}" if tg else "-",
                     f"{ppl['ppl']:.4f} ± {ppl['ppl_error']:.4f}", f"{ppl['ppl_ratio']:.4f}"])
    return head, body


def to_markdown(rows: Sequence[dict]) -> str:
    if not rows:
        return "no results\n"
    head, speed, mhead, models = tables(rows)

    def table(h: list[str], body: list[list[str]]) -> list[str]:
        right = [i for i, name in enumerate(h) if name not in ("model", "settings", "test")]
        sep = ["---:" if i in right else "---" for i in range(len(h))]
        return ["| " + " | ".join(row) + " |" for row in [h, sep, *body]]

    out = [_caption(rows), ""]
    if speed:
        out += table(head, speed) + [""]
    out += table(mhead, models)
    qhead, quants = quality_table(rows)
    if len(quants) > 1:
        out += [""] + table(qhead, quants)
    return "\n".join(out) + "\n"


def print_tables(rows: Sequence[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Piped or redirected, rows stay whole rather than wrapped at 80 columns.
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 240)
    if not rows:
        console.print("no results")
        return
    head, speed, mhead, models = tables(rows)
    qhead, quants = quality_table(rows)
    for h, body, title in ((head, speed, "speed"), (mhead, models, "per model"), (qhead, quants if len(quants) > 1 else [], "quants")):
        if not body:
            continue
        table = Table(title=title, title_justify="left", title_style="bold", header_style="bold", box=None)
        for name in h:
            table.add_column(name, justify="left" if name in ("model", "settings", "test") else "right")
        for cells in body:
            table.add_row(*cells)
        console.print(table)
    console.print(_caption(rows), style="dim")


def render(rows: Sequence[dict], output: str) -> None:
    if output == "table":
        print_tables(rows)
        return
    text = {"json": to_json, "csv": to_csv, "md": to_markdown}[output](rows)
    sys.stdout.write(text)
    sys.stdout.flush()


def plot(rows: Sequence[dict], path: Path) -> None:
    """Throughput against prompt length (pp) and against depth (tg), one line per model+settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    varying = _varying(rows) if rows else []
    qhead, quants = quality_table(rows)
    if len(quants) > 1:  # several quants with a perplexity each: speed against quality too
        fig, (ax_pp, ax_tg, ax_q) = plt.subplots(1, 3, figsize=(18, 4.8))
        _plot_quality(ax_q, rows)
    else:
        fig, (ax_pp, ax_tg) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple, dict[str, list]] = {}
    for r in rows:
        if r["kind"] == "ppl":
            continue
        label = " ".join(filter(None, [r["model"], _settings_label(r["settings"], varying)]))
        if r["kind"] == "tg":
            label += f" tg{r['n_tokens']}"
        s = series.setdefault((r["kind"], label), {"x": [], "y": [], "err": [], "ref": []})
        s["x"].append(r["n_tokens"] if r["kind"] == "pp" else r["depth"])
        s["y"].append(r["mean_ts"])
        s["err"].append(r["std_ts"])
        s["ref"].append(r.get("ref_mean_ts"))
    for (kind, label), s in series.items():
        ax = ax_pp if kind == "pp" else ax_tg
        line = ax.errorbar(s["x"], s["y"], yerr=s["err"], marker="o", capsize=3, label=f"{label} (localrun)")
        if any(v is not None for v in s["ref"]):
            xs = [x for x, v in zip(s["x"], s["ref"]) if v is not None]
            ax.plot(xs, [v for v in s["ref"] if v is not None], linestyle="--", marker="x",
                    color=line.lines[0].get_color(), label=f"{label} (llama.cpp)")
    ax_pp.set(title="prefill", xlabel="prompt tokens", ylabel="tokens/s")
    ax_tg.set(title="decode", xlabel="context depth (tokens)", ylabel="tokens/s")
    for ax in (ax_pp, ax_tg):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    if rows:
        fig.suptitle(_caption(rows), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_quality(ax, rows: Sequence[dict]) -> None:
    """Decode (else prefill) tokens/s against perplexity, one point per quant."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["model_path"] + json.dumps(r["settings"], sort_keys=True), []).append(r)
    kind = "tg" if any(r["kind"] == "tg" for r in rows) else "pp"
    for group in groups.values():
        ppl = next((g for g in group if g["kind"] == "ppl"), None)
        speed = next((g for g in group if g["kind"] == kind), None)
        if ppl is None or speed is None:
            continue
        ax.errorbar([ppl["ppl"]], [speed["median_ts"]], xerr=[ppl["ppl_error"]], marker="o", capsize=3)
        ax.annotate(ppl["quant"] or ppl["model"], (ppl["ppl"], speed["median_ts"]), textcoords="offset points", xytext=(5, 5))
    ax.set(title="speed against quality", xlabel="perplexity (lower is better)", ylabel=f"{kind} tokens/s (median)")
    ax.grid(alpha=0.3)


# -- the command --------------------------------------------------------------------------------------


def run_from_cli(models: Sequence[str], **options: Any) -> int:
    """`localrun bench`: measure, print results (stdout), progress on stderr. Ctrl-C prints what was
    measured so far and returns 130."""
    from ..console import StatusLine, err, notice

    plan = make_plan(models, **options)
    if options.get("rpc"):
        from ..runtime.workers import leave_when_workers_lost

        leave_when_workers_lost()
    results: list[Result] = []
    interrupted = False
    told: set[str] = set()

    def tell(text: str) -> None:  # each notice once, not once per load
        if text not in told:
            told.add(text)
            notice(text)
    with StatusLine("starting") as spinner:  # not Rich's spinner: its redraw thread slows what is measured
        def status(text: str) -> None:
            spinner.update(text)

        measuring = run(plan, status=status, notice=tell)
        try:
            for result in measuring:
                results.append(result)
                row = result.as_row()
                summary = f"{row['ppl']:.4f} PPL" if result.kind == "ppl" else f"{_ts(row)} t/s"
                spinner.print(f"[dim]{row['model']} {row['test']}: {summary}[/dim]", highlight=False)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            measuring.close()  # runs the generator's cleanup (engine freed, peak memory read) now
    rows = rows_of(results)
    if interrupted:
        err.print(f"interrupted: {len(rows)} result(s) measured so far")
    if rows or not interrupted:
        render(rows, plan.output)
    if plan.plot is not None and rows:
        plot(rows, plan.plot)
        err.print(f"plot written to {plan.plot}")
    return EXIT_INTERRUPTED if interrupted else 0
