#!/usr/bin/env python3
"""Speculative decoding with prompt lookup (`--draft lookup`) against plain decoding, SmolLM2, greedy.

Two prompts: a ~450-token "rewrite this text with a small change" prompt, where the answer copies its
input (lookup should help), and an open-ended one, where it cannot (it must not cost much). For each,
interleaved per repetition: plain decoding and lookup decoding of the same number of tokens on one
engine (flash attention off for both, as --draft runs), decode tokens/s from the first token on; then
medians, the speed-up, acceptance, tokens per target step, and whether the outputs are token-identical
(the first differing position if not).

    python scripts/bench_speculative.py [--model PATH] [--reps 3] [--tokens 300] [--threads 2] [--draft-max 8]

Token-identity needs a llama.cpp whose results do not depend on batch shape: build it with
`scripts/build_llama_cpp.sh cpu-exact` (or point LLAMA_CPP_LIB_PATH at such a build).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from localrun.engine import Engine, LoadOptions, SamplingOptions, default_threads, llama_cpp_module, parse_gpu_layers  # noqa: E402
from localrun.engine import generate as engine_generate  # noqa: E402
from localrun.engine.strategies import LookupDrafter, Speculative  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "localrun-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = HERE.parent / "src" / "localrun" / "data" / "wonderland.txt"


CODE = '''def parse_config(path):
    """Read a key=value config file into a dict."""
    result = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def write_config(path, result):
    """Write a dict as a key=value config file."""
    with open(path, "w") as handle:
        for key, value in sorted(result.items()):
            handle.write(f"{key} = {value}\\n")
'''


def prompts() -> dict[str, str]:
    """Raw completions (SmolLM2-135M follows a copy-with-a-change pattern better than an instruction)."""
    text = TEXT.read_text(encoding="utf-8")[300:1900]
    return {
        "rewrite text (~430 tokens)": f"{text}\n\nThe passage above, copied with Alice renamed to Mary:\n\n"
                                      + text.replace("Alice", "Mary")[:80],
        "rename in code (~180 tokens)": f"# Original\n{CODE}\n# Same code with `result` renamed to `settings`\n"
                                        + CODE.replace("result", "settings")[:40],
        "open-ended": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\nStory:",
    }


def generate(engine: Engine, tokens: list[int], n: int, speculative) -> tuple[list[int], object]:
    engine.reset()
    responses = list(engine_generate(engine, tokens, SamplingOptions(temperature=0, max_tokens=n), strategy=speculative))
    return [t for r in responses for t in r.tokens], responses[-1].stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--gpu-layers", default="auto", help="N, auto (all, on a GPU build) or 0")
    args = ap.parse_args()

    ll = llama_cpp_module()
    exact = "LLAMAFILE = 1" not in ll.llama_print_system_info().decode()
    engine = Engine(args.model, LoadOptions(n_ctx=2048, n_threads=args.threads, flash_attn=False,
                                              gpu_layers=parse_gpu_layers(args.gpu_layers)))
    spec = Speculative(LookupDrafter(), args.draft_max)
    device = "GPU offload" if engine.gpu_layers else "CPU"
    print(f"{args.model.name}, {device}, {args.threads} threads, {args.tokens} tokens, greedy, reps {args.reps}; "
          f"llama.cpp build {'without' if exact else 'with'} llamafile sgemm")
    for name, text in prompts().items():
        tokens = engine.tokenize(text)
        plain_ts, spec_ts = [], []
        for _ in range(args.reps):
            a, sa = generate(engine, tokens, args.tokens, None)
            b, sb = generate(engine, tokens, args.tokens, spec)
            plain_ts.append(sa.eval_rate)
            spec_ts.append(sb.eval_rate)
        same = a == b
        diverge = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        p, s = statistics.median(plain_ts), statistics.median(spec_ts)
        print(f"{name}: prompt {len(tokens)} tokens; plain {p:.1f} t/s, lookup {s:.1f} t/s -> {s / p:.2f}x; "
              f"acceptance {sb.acceptance_rate:.2f}, {len(b) / max(1, sb.target_steps):.2f} tokens per target step; "
              f"output {'token-identical' if same else f'differs from token {diverge}'} ({len(a)}/{len(b)} tokens)")
    spec.close()
    engine.close()


if __name__ == "__main__":
    main()
