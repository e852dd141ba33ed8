"""`localrun run` end to end: the installed command, real GGUF models, real llama.cpp."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import LOCALRUN, run_cli
from one_process import Piped, run_all

pytestmark = pytest.mark.slow

PROMPT = "The three primary colours are"


def reference_greedy(path, prompt: str, n: int) -> list[int]:
    """Greedy decoding written directly against llama.cpp's low-level API: the fidelity oracle."""
    import llama_cpp as ll

    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = 512
    ctx = ll.llama_init_from_model(model, cparams)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    data = prompt.encode()
    buf = (ll.llama_token * 512)()
    n_prompt = ll.llama_tokenize(vocab, data, len(data), buf, 512, True, True)
    tokens = list(buf[:n_prompt])
    batch = (ll.llama_token * len(tokens))(*tokens)
    assert ll.llama_decode(ctx, ll.llama_batch_get_one(batch, len(tokens))) == 0
    out = []
    for _ in range(n):
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        if ll.llama_vocab_is_eog(vocab, tok):
            break
        out.append(tok)
        one = (ll.llama_token * 1)(tok)
        assert ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1)) == 0
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return out


def json_events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_greedy_output_matches_llama_cpp_token_for_token(which, request, cli):
    path = request.getfixturevalue(which)
    want = reference_greedy(path, PROMPT, 32)
    r = cli("run", str(path), "--raw", "--temperature", "0", "--max-tokens", "32", "--json", "--ctx", "512", PROMPT)
    assert r.returncode == 0, r.stderr
    done = json_events(r.stdout)[-1]
    assert done["type"] == "done"
    assert done["tokens"] == want
    assert len(want) == 32  # neither model ends its text within 32 tokens here: the whole run is compared


def test_stdout_carries_only_the_answer_and_stats_go_to_stderr(smollm2, cli):
    args = ("run", str(smollm2), "-t", "0", "-n", "16", "--no-cache", "What is 2+2?")
    r = cli(*args, "--verbose")
    assert r.returncode == 0, r.stderr
    # The reference: the same greedy run as JSON events, its answer text and stats.
    done = json_events(cli(*args, "--json").stdout)[-1]
    assert r.stdout == done["text"] + ("" if done["text"].endswith("\n") else "\n")
    stats = done["stats"]
    assert "eval rate" not in r.stdout and "eval rate:" in r.stderr
    assert "time to first token:" in r.stderr
    assert re.search(r"^prompt eval count:\s+(\d+) token\(s\)$", r.stderr, re.M).group(1) == str(stats["prompt_tokens"])
    assert re.search(r"^eval count:\s+(\d+) token\(s\)$", r.stderr, re.M).group(1) == str(len(done["tokens"]))
    assert stats["generated_tokens"] == len(done["tokens"]) == stats["eval_tokens"] + 1  # --json says both counts
    assert re.search(r"^finish reason:\s+(\w+)$", r.stderr, re.M).group(1) == stats["finish_reason"]


def test_same_seed_same_text_different_seed_differs(smollm2, isolated_home):
    args = ("run", str(smollm2), "--raw", "-t", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-n", "24")
    a, b, c, d = run_all(
        [*args, "--seed", "7", "Once upon a time"],
        [*args, "--seed", "7", "Once upon a time"],
        [*args, "--seed", "8", "Once upon a time"],
        # llama.cpp's spelling of the temperature (--temp) is the same option
        [*[("--temp" if x == "-t" else x) for x in args], "--seed", "7", "Once upon a time"], home=isolated_home)
    assert a.returncode == b.returncode == c.returncode == d.returncode == 0
    assert a.stdout == b.stdout == d.stdout
    assert a.stdout != c.stdout


def test_typical_p_and_mirostat_each_change_the_sampled_text(smollm2, isolated_home):
    """--typical-p and --mirostat 1|2 each run and take part in sampling: with the same seed, each gives its own
    text (an option the chain ignored would give the plain text), and the same text again."""
    args = ("run", str(smollm2), "--raw", "-t", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-n", "24",
            "--threads", "1", "--seed", "7", "--json")
    variants = {"plain": (), "typical": ("--typical-p", "0.2"), "mirostat1": ("--mirostat", "1"), "mirostat2": ("--mirostat", "2")}
    texts = {}
    *runs, again = run_all(*[[*args, *extra, "Once upon a time"] for extra in variants.values()],
                           [*args, "--mirostat", "2", "Once upon a time"], home=isolated_home)
    for name, r in zip(variants, runs):
        assert r.returncode == 0, (name, r.stderr)
        done = json_events(r.stdout)[-1]
        assert done["stats"]["finish_reason"] == "length", name
        texts[name] = done["tokens"]
    assert len({tuple(t) for t in texts.values()}) == 4, texts  # all four differ
    again = json_events(again.stdout)[-1]
    assert again["tokens"] == texts["mirostat2"]  # Mirostat's own draws follow the seed too


def test_grammar_file_constrains_the_answer(smollm2, isolated_home, tmp_path):
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= ("yes" | "no")\n')
    args = ("run", str(smollm2), "-t", "0", "-n", "8", "--threads", "1", "--json")
    free, r, sampled = run_all(
        [*args, "Is the sky blue?"], [*args, "--grammar", grammar, "Is the sky blue?"],
        ["run", smollm2, "-t", "1.5", "--top-k", "0", "--min-p", "0", "-n", "8", "--seed", "3", "--threads", "1",
         "--grammar", grammar, "Is the sky blue?"], home=isolated_home)
    free = json_events(free.stdout)[-1]
    assert free["text"].strip() not in ("yes", "no")  # the control: unconstrained, the model says more
    assert r.returncode == 0, r.stderr
    done = json_events(r.stdout)[-1]
    assert done["text"] in ("yes", "no")
    assert done["stats"]["finish_reason"] == "eos"  # the grammar is complete: only end-of-text was left
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout in ("yes\n", "no\n")


def test_json_schema_output_parses_and_validates(smollm2, isolated_home, tmp_path):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    url = {"type": "object", "properties": {"url": {"type": "string", "pattern": "^https://"}}, "required": ["url"]}
    r, inline, linked, any_object = run_all(
        ["run", smollm2, "-t", "0", "-n", "80", "--json-schema", f, "Describe a person named Ann who is 31 as JSON."],
        # Inline, under Ollama's flag name: the same answer; `--format json`: any JSON object (as `ollama run --format json`)
        ["run", smollm2, "-t", "0", "-n", "80", "--format", json.dumps(schema), "Describe a person named Ann who is 31 as JSON."],
        ["run", smollm2, "-t", "0", "-n", "60", "--format", json.dumps(url), "Give a URL as JSON"],  # // kept as written
        ["run", smollm2, "-t", "0", "-n", "200", "--format", "json", "Give Ann's name and age (31) as JSON."], home=isolated_home)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    jsonschema.validate(data, schema)
    assert inline.returncode == 0 and inline.stdout == r.stdout, inline.stderr
    assert linked.returncode == 0 and json.loads(linked.stdout)["url"].startswith("https://"), linked.stdout + linked.stderr
    assert any_object.returncode == 0 and isinstance(json.loads(any_object.stdout), dict), any_object.stdout


STOPPING = ("--raw", "-t", "0", "-n", "40", "--ctx", "512", "--threads", "1")


@pytest.fixture(scope="module")
def unstopped(smollm2, tmp_path_factory) -> list[dict]:
    """The events of `run --json` for PROMPT, greedy, without a stop: where the stop tests find theirs."""
    r = run_cli("run", str(smollm2), *STOPPING, "--json", PROMPT, env={"LOCALRUN_HOME": str(tmp_path_factory.mktemp("unstopped"))})
    assert r.returncode == 0, r.stderr
    return json_events(r.stdout)


def test_stop_sequence_split_across_tokens_is_cut_exactly(smollm2, unstopped, isolated_home):
    events = unstopped
    pieces = [e["text"] for e in events if e["type"] == "token"]
    text = "".join(pieces)
    # Find a boundary between two tokens with at least 2 characters on each side, then stop there.
    pos = 0
    for left, right in zip(pieces, pieces[1:]):
        pos += len(left)
        if len(left) >= 2 and len(right) >= 2 and left.strip() and right.strip():
            stop = text[pos - 2 : pos + 2]
            break
    else:
        pytest.skip("no suitable token boundary in the greedy output")
    cut = text.find(stop)
    r, rj = run_all(["run", smollm2, *STOPPING, "--stop", stop, PROMPT], ["run", smollm2, *STOPPING, "--json", "--stop", stop, PROMPT],
                    home=isolated_home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == text[:cut] + ("\n" if cut and not text[:cut].endswith("\n") else "")
    assert stop not in r.stdout
    done = json_events(rj.stdout)[-1]
    assert done["text"] == text[:cut]
    assert done["stats"]["finish_reason"] == "stop"


def test_repeated_stops_the_earliest_one_cuts(smollm2, unstopped, cli):
    args = ("run", str(smollm2), *STOPPING, "--json")
    text = unstopped[-1]["text"]
    # Three stops from the greedy text, at about a quarter, half and three quarters of it (each first seen there).
    stops = []
    for at in (len(text) // 2, len(text) // 4, 3 * len(text) // 4):
        for start in range(at, len(text) - 4):
            piece = text[start : start + 4]
            if text.find(piece) == start and piece.strip() == piece and piece.isprintable():
                stops.append(piece)
                break
    assert len(stops) == 3, text
    cuts = [text.find(s) for s in stops]
    assert cuts[1] < cuts[0] < cuts[2]  # the earliest is neither the first flag nor the last
    r = cli(*args, "--stop", stops[0], "-s", stops[1], "--stop", stops[2], PROMPT)
    assert r.returncode == 0, r.stderr
    done = json_events(r.stdout)[-1]
    # Honouring only the first flag would cut at stops[0], only the last at stops[2].
    assert done["text"] == text[: cuts[1]] and done["stats"]["finish_reason"] == "stop"


def test_pipe_into_head_exits_cleanly(smollm2):
    proc = subprocess.run(
        ["bash", "-c", f'set -o pipefail; "{LOCALRUN}" run "{smollm2}" --raw -t 0 --min-tokens 200 -n 200 "Count: 1, 2, 3," | head -c 20; echo "rc=${{PIPESTATUS[0]}}" >&2'],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert len(proc.stdout) == 20
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert "rc=0" in proc.stderr


def test_stdin_comes_first_then_the_argument(smollm2, cli, isolated_home):
    piped = cli("run", str(smollm2), "--raw", "-t", "0", "-n", "12", "--ctx", "512", "continue the list:", input="apples, pears,")
    joined, pj = run_all(
        ["run", smollm2, "--raw", "-t", "0", "-n", "12", "--ctx", "512", "apples, pears,\n\ncontinue the list:"],
        # The joined prompt's answer as JSON, its stdin a file: compared below with llama.cpp's low-level API's
        Piped(["run", smollm2, "--raw", "-t", "0", "-n", "12", "--ctx", "512", "--json", "continue the list:"], "apples, pears,"),
        home=isolated_home)
    assert piped.returncode == joined.returncode == 0
    assert piped.stdout == joined.stdout
    # The joined prompt's answer, by llama.cpp's low-level API (stdin, a blank line, then the argument).
    done = json_events(pj.stdout)[-1]
    assert done["tokens"] == reference_greedy(smollm2, "apples, pears,\n\ncontinue the list:", 12)
    assert piped.stdout == done["text"] + ("" if done["text"].endswith("\n") else "\n")


def test_base_model_without_template_falls_back_with_a_notice(gemma, isolated_home):
    r, rj = run_all(["run", gemma, "-t", "0", "-n", "8", "--ctx", "512", PROMPT],
                    ["run", gemma, "-t", "0", "-n", "8", "--ctx", "512", "--json", PROMPT], home=isolated_home)
    assert r.returncode == 0, r.stderr
    assert "no chat template" in r.stderr and "no chat template" in rj.stderr  # each run says it
    # Falling back means the prompt goes as it is: the answer is llama.cpp's own greedy continuation of it.
    done = json_events(rj.stdout)[-1]
    assert done["tokens"] == reference_greedy(gemma, PROMPT, 8)
    assert r.stdout == done["text"] + ("" if done["text"].endswith("\n") else "\n")


COUNT_TO_300 = ", ".join(str(i) for i in range(1, 301)) + ","  # 1391 tokens: SmolLM2 splits numbers into digits


def test_prompt_too_long_names_both_numbers_and_truncate_keeps_the_end(smollm2, isolated_home):
    from localrun.engine import Engine, LoadOptions, SamplingOptions
    from localrun.runtime.request import Request, prompt_for

    engine = Engine(smollm2, LoadOptions(n_ctx=128, n_threads=1))
    try:
        full = engine.tokenize(COUNT_TO_300, add_special=True, parse_special=True)
        request = Request(messages=[{"role": "user", "content": COUNT_TO_300}], raw=True, truncate=True,
                          sampling=SamplingOptions(max_tokens=4))
        kept = prompt_for(engine, request).tokens
        tail = engine.detokenize(kept)
        assert engine.tokenize(tail, add_special=True, parse_special=True) == kept  # the end, as text, is those tokens
    finally:
        engine.close()
    assert full[0] != engine.info.bos_token_id  # SmolLM2 adds no BOS: nothing is kept from the start
    # 128 - 4 tokens for the answer: the last 124 of the prompt.
    assert kept == full[-124:] and tail.endswith(", 299, 300,")

    args = ("run", str(smollm2), "--raw", "-t", "0", "--ctx", "128", "-n", "4", "--threads", "1", "--no-cache", "--json")
    # The reference (the last): the kept end given as the whole prompt. Same tokens, so the same greedy answer,
    # which goes on counting from the end.
    r, ok, reference = run_all(["run", smollm2, "--raw", "--ctx", "128", "-n", "4", COUNT_TO_300],
                               [*args, "--truncate", COUNT_TO_300], [*args, tail], home=isolated_home)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1
    assert f"the prompt is {len(full)} tokens but the context holds 128" in r.stderr and "--truncate" in r.stderr

    assert ok.returncode == 0, ok.stderr
    done = json_events(ok.stdout)[-1]
    assert done["stats"]["prompt_tokens"] == done["stats"]["prompt_eval_tokens"] == 124
    reference = json_events(reference.stdout)[-1]
    assert reference["stats"]["prompt_tokens"] == 124
    assert done["tokens"] == reference["tokens"] and done["text"] == reference["text"] == " 301"


def test_truncate_with_the_chat_template_cuts_the_message_not_the_template(smollm2):
    """--truncate kept the end of the rendered prompt, cutting the system prompt and role markers;
    now the start of the last message goes, and the template around it stays."""
    from localrun.engine import Engine, LoadOptions, SamplingOptions
    from localrun.runtime.request import Request, prompt_for

    engine = Engine(smollm2, LoadOptions(n_ctx=128, n_threads=1))
    try:
        words = " ".join(f"w{i}" for i in range(400))
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": words}]
        request = Request(messages=messages, sampling=SamplingOptions(max_tokens=16), truncate=True)
        tokens = prompt_for(engine, request).tokens
        assert len(tokens) <= 128 - 16
        text = engine.detokenize(tokens)  # special tokens (<|im_start|> ...) print as nothing
        assert text.startswith("system\nYou are terse.\nuser\n"), text[:80]
        assert text.endswith(" w399\nassistant\n") and " w1 " not in text
    finally:
        engine.close()


LIMITS = ["-1", "-2"]  # -2: llama.cpp's "until the context fills", read as -1


@pytest.fixture(scope="module")
def unlimited(smollm2, tmp_path_factory) -> dict:
    """A run in a 32-token context with each of LIMITS as -n, in one process."""
    runs = run_all(*[["run", smollm2, "--raw", "-t", "0", "--ctx", "32", "-n", limit, "--min-tokens", "100", "--json", "Once upon a time"]
                     for limit in LIMITS], home=tmp_path_factory.mktemp("limits"))
    return dict(zip(LIMITS, runs))


@pytest.mark.parametrize("limit", LIMITS)
def test_reaching_the_context_limit_reports_length(unlimited, limit):
    r = unlimited[limit]
    assert r.returncode == 0, r.stderr
    stats = json_events(r.stdout)[-1]["stats"]
    assert stats["finish_reason"] == "length"
    # The context holds 32 tokens; the last sampled token is shown without needing a KV slot.
    assert stats["prompt_tokens"] + stats["eval_tokens"] + 1 == 32 + 1


def test_gpu_layers_on_a_cpu_build_prints_one_notice_and_runs(smollm2, cli):
    from localrun.engine.llama import supports_gpu_offload

    if supports_gpu_offload():  # a GPU (llama.cpp's own llama_supports_gpu_offload also says yes for any RPC build)
        pytest.skip("this build has a GPU backend")
    r = cli("run", str(smollm2), "--raw", "-t", "0", "-n", "4", "--gpu-layers", "99", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("no GPU backend") == 1
    r = cli("run", str(smollm2), "--raw", "-t", "0", "-ngl", "99", "-n", "4", "Hi")  # llama.cpp's spelling
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("no GPU backend") == 1


@pytest.mark.parametrize("how", ["runner", "engine", "show"])
def test_llama_cpp_is_loaded_before_numpy(smollm2, how):
    """Found on a CUDA build (H100, CUDA 13, /opt/gcc toolchain): libggml-cuda.so there exports its own copy of
    libstdc++'s locale symbols, and when numpy (which the gguf package imports) has loaded the system libstdc++
    first, the tokenizer's std::regex segfaults inside llama_model_load_from_file. Loading llama.cpp's libraries
    before numpy avoids it, so every path that loads a model does that first. Checked here by recording the order
    in which imports start (the CPU build would not crash either way)."""
    load = {"runner": "from localrun.runtime import load; from localrun.runtime.options import LoadSpec; "
                      f"load({str(smollm2)!r}, LoadSpec(ctx=64, threads=1))",
            "engine": "from localrun.engine import Engine, LoadOptions; "
                      f"Engine({str(smollm2)!r}, LoadOptions(n_ctx=64, n_threads=1))",
            "show": f"from localrun.cli import main; sys.argv = ['localrun', 'show', {str(smollm2)!r}]\n"
                    "try:\n    main()\nexcept SystemExit:\n    pass"}[how]
    code = ("import sys\norder = []\nclass Seen:\n    def find_spec(self, name, path=None, target=None):\n"
            "        order.append(name)\nsys.meta_path.insert(0, Seen())\n"
            f"{load}\n"
            "print('loaded', *sorted(m for m in ('numpy', 'llama_cpp.llama', 'gguf.gguf_reader') if m in sys.modules), file=sys.stderr)\n"
            "import numpy\n"  # numpy after all, once what the load imported is written down
            "print('order', *(order.index(m) if m in order else -1 for m in ('llama_cpp', 'llama_cpp.llama_cpp', 'numpy')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # Loading a model needs neither numpy nor llama_cpp's high-level Llama class nor gguf's reader (0.15 s of
    # CPU on every start): the bindings and gguf's tables are imported without their packages' __init__.
    assert out.stderr.split("loaded")[-1].split("order ")[0].split() == [], out.stderr
    package_at, bindings_at, numpy_at = map(int, out.stderr.split("order ")[-1].split("\n")[0].split())
    assert package_at < bindings_at < numpy_at


def test_the_rest_of_a_package_imported_submodule_first_is_there_on_first_use(smollm2):
    """lazy.submodule_first gives llama_cpp's bindings without its __init__; a program that embeds localrun and
    then asks the package for its Llama class or version still gets them (its __init__ runs then, once, while
    eight threads ask at the same moment: a server's requests did, and all but the first got an AttributeError),
    and llama.cpp's log still comes to localrun afterwards (that __init__ sets llama-cpp-python's own callback)."""
    code = ("import sys, threading\nfrom localrun.engine import Engine, LoadOptions, llama_cpp_module\n"
            "from localrun.engine.llama import captured_llama_log\nll = llama_cpp_module()\n"
            "assert callable(ll.llama_backend_init) and 'llama_cpp.llama' not in sys.modules\n"
            "import llama_cpp\nassert llama_cpp is ll\nseen = []\n"
            "threads = [threading.Thread(target=lambda: seen.append(llama_cpp.__version__)) for _ in range(8)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\n"
            f"with captured_llama_log() as lines:\n    Engine({str(smollm2)!r}, LoadOptions(n_ctx=64, n_threads=1)).close()\n"
            "print(*set(seen), len(seen), llama_cpp.Llama.__name__, 'llama_cpp.llama' in sys.modules, len(lines) > 10)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from importlib.metadata import version

    assert out.stdout.split() == [version("llama-cpp-python"), "8", "Llama", "True", "True"]


def test_ctrl_c_while_llama_cpp_logs_during_load_is_not_lost(smollm2):
    """A Ctrl-C that lands while llama.cpp is inside our log callback (model load calls it hundreds of times)
    used to be swallowed by ctypes ("Exception ignored on calling ctypes callback") and the command went on:
    9 of 30 Ctrl-Cs during `localrun run`'s load. Here SIGINT is raised from inside that callback."""
    code = (
        "import signal\n"
        "from localrun import engine\n"
        "from localrun.engine import llama\n"
        "engine.llama_cpp_module()\n"
        "class Trigger(list):\n"
        "    def append(self, item):\n"
        "        if not self:\n"
        "            signal.raise_signal(signal.SIGINT)\n"
        "        super().append(item)\n"
        "llama._log_sink = Trigger()\n"
        "try:\n"
        f"    engine.Engine({str(smollm2)!r}, engine.LoadOptions(n_ctx=64, n_threads=1))\n"
        "    print('loaded')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', len(llama._log_sink) > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["interrupted", "True"], out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr


def test_min_tokens_suppresses_end_of_generation(smollm2, isolated_home):
    plain, r = run_all(["run", smollm2, "-t", "0", "-n", "60", "--json", "Say hi."],
                       ["run", smollm2, "-t", "0", "--min-tokens", "60", "-n", "60", "--json", "Say hi."], home=isolated_home)
    # The control: without --min-tokens the answer ends with end-of-text well before 60 tokens.
    plain = json_events(plain.stdout)[-1]
    assert plain["stats"]["finish_reason"] == "eos" and len(plain["tokens"]) < 50
    assert r.returncode == 0, r.stderr
    done = json_events(r.stdout)[-1]
    stats = done["stats"]
    assert stats["eval_tokens"] + 1 == 60 and stats["finish_reason"] == "length"
    # The same greedy answer up to where it ended; there the end-of-text was suppressed and it went on.
    assert done["tokens"][: len(plain["tokens"])] == plain["tokens"] and len(done["tokens"]) == 60


def test_logit_bias_bans_a_token(smollm2, isolated_home):
    [tok] = reference_greedy(smollm2, PROMPT, 1)  # the token to ban, by llama.cpp's low-level API
    first, banned = run_all(["run", smollm2, "--raw", "-t", "0", "-n", "1", "--json", PROMPT],
                            ["run", smollm2, "--raw", "-t", "0", "-n", "1", "--json", "--logit-bias", f"{tok}=-inf", PROMPT],
                            home=isolated_home)
    assert json_events(first.stdout)[-1]["tokens"][0] == tok  # the control: unbiased, the command picks it
    assert json_events(banned.stdout)[-1]["tokens"][0] != tok


PENALTIES = [("--repeat-penalty", "1.8"), ("--frequency-penalty", "1.5"), ("--presence-penalty", "2")]


@pytest.fixture(scope="module")
def penalised(smollm2, tmp_path_factory) -> dict:
    """The greedy answer to a repetitive prompt (key None), and with each of PENALTIES: in one process, the plain
    answer once for the three."""
    args = ("run", str(smollm2), "--raw", "-t", "0", "-n", "48", "--json", "The cat sat on the mat. The cat sat on the mat. The cat")
    runs = run_all(args, *[[*args, flag, value, "--repeat-last-n", "64"] for flag, value in PENALTIES],
                   home=tmp_path_factory.mktemp("penalties"))
    return dict(zip([None, *PENALTIES], runs))


@pytest.mark.parametrize("flag,value", PENALTIES)
def test_penalties_cut_repetition(penalised, flag, value):
    """Greedy decoding of a repetitive prompt repeats it; each penalty, applied in the C chain over the
    prompt and the answer, makes it repeat tokens less (these flags crashed the chain once: no test had run them)."""
    plain = json_events(penalised[None].stdout)[-1]["tokens"]
    r = penalised[flag, value]
    assert r.returncode == 0, r.stderr
    penalised = json_events(r.stdout)[-1]["tokens"]
    assert penalised != plain
    assert len(set(penalised)) / len(penalised) > len(set(plain)) / len(plain)


def test_an_empty_argument_is_no_prompt(smollm2, cli):
    r = cli("run", str(smollm2), "")
    assert r.returncode == 2 and "no prompt" in r.stderr and not r.stdout


def test_stdin_that_is_not_utf8_is_one_line_and_exit_2(smollm2):
    r = subprocess.run([LOCALRUN, "run", str(smollm2)], input=b"\xff\xfe caf\xe9", capture_output=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode().strip().splitlines() == ["error: stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)"]


def test_a_bad_cache_size_fails_before_the_answer(smollm2, cli):
    """LOCALRUN_CACHE_MAX was read only when the answer was stored: the answer streamed, then exit 2."""
    r = cli("run", str(smollm2), "-n", "3", "hi", env={"LOCALRUN_CACHE_MAX": "lots"})
    assert r.returncode == 2 and "LOCALRUN_CACHE_MAX" in r.stderr and r.stdout == ""


BAD = [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--min-p", "2"], "--min-p"),
    (["--mirostat", "3"], "--mirostat"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--kv-type", "q5_1"], "--kv-type"),
    (["--kv-type", "q8_0", "--no-flash-attn"], "flash"),
    (["--gpu-layers", "lots"], "--gpu-layers"),
    (["--logit-bias", "nonsense"], "--logit-bias"),
    (["--logit-bias", "99999999=1"], "--logit-bias"),
    (["--logit-bias", "5=inf"], "--logit-bias"),  # +inf made the chain's softmax NaN: it drew the last token
    (["--logit-bias", "5=nan"], "--logit-bias"),
    (["--session", ""], "session name"),  # '' ran without a session, silently
    (["--beams", "2", "--min-tokens", "3"], "--beams"),  # beam search ignored min_tokens (and grammars)
    (["--beams", "2", "--session", "s"], "--session"),  # the answer streamed, then the session could not be saved
    (["--json-schema", "/nonexistent/schema.json"], "--json-schema"),
    (["--ctx", "4"], "--ctx"),
    (["--source", "ftp"], "--source"),
    (["--stop", ""], "stop"),
    (["--threads", "0"], "--threads"),
    (["--seed", "-5"], "--seed"),
]


@pytest.fixture(scope="module")
def refused(smollm2, tmp_path_factory) -> dict:
    """`localrun run MODEL ARGS hello` for each of BAD's ARGS, in one process."""
    runs = run_all(*[["run", smollm2, *args, "hello"] for args, _ in BAD], home=tmp_path_factory.mktemp("bad-options"))
    return {tuple(args): r for (args, _), r in zip(BAD, runs)}


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_is_one_line_and_exit_2(refused, args, needle):
    r = refused[tuple(args)]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
