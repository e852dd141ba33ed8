"""The resident runtime end to end: one `localrun serve` process holding several real models, loading them
when a request names them, keeping them for their keep-alive, evicting the least recently used one to make
room, reloading on other load-time options, and `localrun ps` / `localrun stop` against it."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx
import pytest

from conftest import start_server, wait_until
from one_process import run_all

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


def ps(server) -> list[dict]:
    return httpx.get(server.url + "/api/ps").json()["models"]


def ask(server, model, prompt="The capital of France is", n=8, **extra) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=120, json={
        "model": str(model), "prompt": prompt, "max_tokens": n, "temperature": 0, **extra})


def references(*models, prompt="The capital of France is", n=8) -> list[str]:
    """What `localrun run` answers in-process (greedy, raw) for each of `models`, all in one process."""
    runs = [["run", str(model), "--raw", "-t", "0", "-n", str(n), "--no-cache", "--threads", "1", prompt] for model in models]
    done = run_all(*runs, home=os.environ["LOCALRUN_HOME"], env={"LOCALRUN_KEEP_ALIVE": "0"})
    assert [r.returncode for r in done] == [0] * len(runs), [r.stderr for r in done]
    return [r.stdout.rstrip("\n") for r in done]


@pytest.fixture
def server_factory(tmp_path):
    started = []

    def start(*args, model=None):
        srv = start_server(model, tmp_path / "home", *args)
        started.append(srv)
        return srv

    yield start
    codes = [srv.stop() for srv in started if srv.proc.poll() is None]  # every one stopped, then checked
    assert codes == [130] * len(codes)


def test_many_models_on_one_server_answer_as_run_does(server_factory, smollm2, gemma, cli):
    """No model at start; each request names a file; both stay loaded, each answering token for token as
    `localrun run` does in-process, and `ps` (HTTP and CLI) lists them with their slots and expiry."""
    srv = server_factory("--parallel", "2", "--ctx", "512")
    assert ps(srv) == []
    assert httpx.get(srv.url + "/health").json()["models"] == 0
    answers = {}
    for model in (smollm2, gemma):
        r = ask(srv, model)
        assert r.status_code == 200, r.text
        answers[model.name] = r.json()["choices"][0]["text"]
        assert r.json()["model"] == str(model)  # the name the request used (ps lists the file's name)
    loaded = {m["name"]: m for m in ps(srv)}
    assert set(loaded) == {smollm2.name, gemma.name}
    for m in loaded.values():
        assert m["slots"] == 2 and m["context_length"] == 512 and m["slots_busy"] == 0 and m["requests"] == 0
        assert m["processor"] == "100% CPU" and m["size"] > 0 and m["expires_at"]  # the default keep-alive: 5m
    assert loaded[gemma.name]["size"] > loaded[smollm2.name]["size"]  # 262k vocabulary
    assert answers == dict(zip((smollm2.name, gemma.name), references(smollm2, gemma)))

    listed = cli("ps", "--port", str(srv.port), "--json")
    assert listed.returncode == 0, listed.stderr
    assert {m["name"] for m in json.loads(listed.stdout)} == {smollm2.name, gemma.name}
    for host in (f"127.0.0.1:{srv.port}", f"http://127.0.0.1:{srv.port}"):  # as OLLAMA_HOST takes it
        by_host = cli("ps", "--host", host, "--json")
        assert by_host.returncode == 0 and {m["name"] for m in json.loads(by_host.stdout)} == {smollm2.name, gemma.name}, by_host.stderr
    bad = cli("ps", "--host", "127.0.0.1:port")
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr
    table = cli("ps", "--port", str(srv.port))
    assert "PROCESSOR" in table.stdout and smollm2.name in table.stdout and "0/2" in table.stdout

    # Requests naming the same file another way share the loaded model (no second copy).
    r = ask(srv, smollm2.name)
    assert r.status_code == 200 and len(ps(srv)) == 2

    stopped = cli("stop", smollm2.name, "--port", str(srv.port))
    assert stopped.returncode == 0 and f"unloaded {smollm2.name}" in stopped.stderr
    wait_until(lambda: [m["name"] for m in ps(srv)] == [gemma.name], what="smollm2 to unload")
    assert cli("stop", "nothing-like-this", "--port", str(srv.port)).returncode == 1
    # The server ends with an answer in progress: said (another terminal's answer was cut silently: a helper's run)
    body = {"model": str(gemma), "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=120, json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        bye = cli("stop", "--server", "--port", str(srv.port))
        list(lines)
    assert bye.returncode == 0 and gemma.name in bye.stderr and "1 answer(s) in progress were ended" in bye.stderr, bye.stderr
    assert srv.proc.wait(timeout=30) == 0  # ended on request: not interrupted


def test_keep_alive_per_request_and_server_default(server_factory, smollm2, gemma):
    srv = server_factory("--parallel", "1", "--ctx", "256", "--keep-alive", "1s")
    assert ask(srv, smollm2, keep_alive=0).status_code == 200  # unload after this answer
    wait_until(lambda: ps(srv) == [], what="keep_alive 0 to unload")
    assert ask(srv, smollm2, keep_alive=-1).status_code == 200  # forever
    assert ask(srv, gemma).status_code == 200  # the server's 1s
    wait_until(lambda: [m["name"] for m in ps(srv)] == [smollm2.name], what="gemma's 1s keep-alive to run out")
    (kept,) = ps(srv)
    # never: Ollama's far future (a date clients parse), and no keep-alive
    assert datetime.fromisoformat(kept["expires_at"]).year > datetime.now().year + 100 and kept["keep_alive"] is None
    bad = ask(srv, smollm2, keep_alive="soon")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_lru_eviction_memory_budget_and_a_model_too_big(server_factory, smollm2, gemma, cli):
    from localrun.runtime.options import LoadSpec
    from localrun.runtime.serving.pool import estimate_bytes

    spec = LoadSpec(ctx=256, parallel=1)
    small, big = estimate_bytes(smollm2, spec), estimate_bytes(gemma, spec)
    # Each fits alone, not both: loading one unloads the other (the least recently used idle one).
    srv = server_factory("--parallel", "1", "--ctx", "256", "--memory-budget", str(big + small // 2))
    assert ask(srv, smollm2).status_code == 200
    assert [m["size"] for m in ps(srv)] == [small]  # the estimate ps reports is the one the budget counts
    assert ask(srv, gemma).status_code == 200
    assert [m["name"] for m in ps(srv)] == [gemma.name]
    wait_until(lambda: any(f"unloading {smollm2.name} to make room" in line for line in srv.stderr), what="the notice")

    # A model in use is never evicted: while a long stream holds gemma, a request for smollm2 waits for it to
    # finish (as Ollama queues a request for a model that needs room), then gemma goes to make room.
    stream = httpx.stream("POST", srv.url + "/v1/completions", timeout=120, json={
        "model": str(gemma), "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True,
        "ignore_eos": True})
    with stream as r, ThreadPoolExecutor(1) as pool:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        # A client that goes away while its load waits: the load stops waiting (nothing unloaded or loaded for nobody)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", timeout=1.0, json={"model": str(smollm2), "prompt": "Hi", "max_tokens": 2})
        wait_until(lambda: any("| 499 |" in line and smollm2.name in line for line in srv.stderr), what="the wait to end")
        assert not any(f"unloading {gemma.name}" in line for line in srv.stderr) and [m["name"] for m in ps(srv)] == [gemma.name]
        queued = pool.submit(ask, srv, smollm2)
        wait_until(lambda: sum(f"waiting for {gemma.name} to finish" in line for line in srv.stderr) == 2, what="the load to wait")
        rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"  # the stream went on undisturbed
        assert queued.result(timeout=120).status_code == 200
    assert [m["name"] for m in ps(srv)] == [smollm2.name]

    # --max-models 1: the count caps too, whatever the memory.
    capped = server_factory("--parallel", "1", "--ctx", "256", "--max-models", "1")
    assert ask(capped, smollm2).status_code == 200 and ask(capped, gemma).status_code == 200
    assert [m["name"] for m in ps(capped)] == [gemma.name]

    # Too big even alone: refused with both numbers, and the server goes on.
    tiny = server_factory("--parallel", "1", "--ctx", "256", "--memory-budget", "50M")
    r = ask(tiny, smollm2)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_too_big"
    message = r.json()["error"]["message"]
    assert f"{small / 2**20:.0f} MiB" in message and f"{50e6 / 2**20:.0f} MiB" in message
    assert httpx.get(tiny.url + "/health").json()["status"] == "ok"


def test_other_load_options_reload_the_model_with_a_notice(server_factory, smollm2, tmp_path):
    srv = server_factory("--parallel", "1", "--ctx", "256")
    first = ask(srv, smollm2)
    assert first.status_code == 200 and [m["context_length"] for m in ps(srv)] == [256]
    again = ask(srv, smollm2, options={"num_ctx": 512})
    assert again.status_code == 200
    assert [m["context_length"] for m in ps(srv)] == [512]  # one instance, reloaded
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert any("reloading" in line and "ctx 256 -> 512" in line for line in srv.stderr), srv.stderr
    # A file that changed on disk (pulled again, re-quantized in place) is loaded again, not served stale.
    import os
    import shutil

    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2, copy)
    assert ask(srv, copy).status_code == 200
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert ask(srv, copy).status_code == 200
    assert any("reloading copy.gguf" in line and "the file changed on disk" in line for line in srv.stderr), srv.stderr
    bad = ask(srv, smollm2, options={"num_ctx": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "options.num_ctx"
    bad = ask(srv, smollm2, options={"num_ctxx": 512})
    assert bad.status_code == 400 and "num_ctxx" in bad.json()["error"]["message"]


def test_a_model_that_fails_to_load_fails_only_its_request(server_factory, smollm2, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)  # a header that lies
    srv = server_factory("--parallel", "1", "--ctx", "256", model=smollm2)
    r = ask(srv, broken)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model_file", r.text  # the request's file is no model
    assert "broken.gguf" in r.json()["error"]["message"] and r.json()["error"]["param"] == "model"
    missing = ask(srv, "no-such-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert "no-such-model" in missing.json()["error"]["message"]
    assert missing.json()["error"]["message"].endswith(": GET /v1/models lists the models this server has")  # not a CLI hint
    family = ask(srv, "llama3.2")  # Ollama's family name: the sizes the catalogue has, in the server's words
    assert family.status_code == 404 and family.json()["error"]["message"] == (
        "unknown model 'llama3.2': did you mean llama3.2-1b or llama3.2-3b? GET /v1/models lists the models this server has")
    unpulled = ask(srv, "smollm2")  # an alias this home has not pulled: the server does not pull on request
    assert unpulled.status_code == 404 and "localrun pull smollm2" in unpulled.json()["error"]["message"]
    # The server and its model go on; a request naming no model gets the command line's.
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["model"] == smollm2.name
    (only,) = ps(srv)
    assert only["name"] == smollm2.name  # named at start: kept, never expiring (Ollama's far future)
    assert datetime.fromisoformat(only["expires_at"]).year > datetime.now().year + 100


def test_no_model_named_and_none_at_start(server_factory):
    srv = server_factory()
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # localrun's own /api/run (sessions, any file by path) is only on the background server's private socket
    assert httpx.post(srv.url + "/api/run", json={"model": "x", "request": {}}).status_code == 404


def test_ps_and_stop_usage(cli):
    assert cli("stop").returncode == 2
    assert cli("stop", "x", "--all").returncode == 2
    gone = cli("ps", "--port", "1")
    assert gone.returncode == 1 and "no localrun server at http://127.0.0.1:1" in gone.stderr
    assert cli("serve", "--keep-alive", "soon", "--port", "0").returncode == 2
    assert cli("serve", "--memory-budget", "lots", "--port", "0").returncode == 2


def test_keep_alive_parsing():
    from localrun.errors import UsageError
    from localrun.runtime.options import FOREVER, parse_keep_alive

    cases = {"5m": 300, "90s": 90, "1h30m": 5400, "0": 0, 0: 0, "-1": FOREVER, -5: FOREVER, "2.5": 2.5, "1h": 3600,
             "-1m": FOREVER, "inf": FOREVER, 1e20: FOREVER}
    for given, seconds in cases.items():
        assert parse_keep_alive(given) == seconds, given
    for bad in ("", "soon", "5x", "m", True, "nan", float("nan")):
        with pytest.raises(UsageError):
            parse_keep_alive(bad)


def test_bad_requests_leave_the_server_as_it_was(server_factory, smollm2, tmp_path):
    """What an exploratory pass found: each refused with 400/404 and the usual body, the loaded model kept."""
    srv = server_factory("--parallel", "1", "--ctx", "256")
    assert ask(srv, smollm2).status_code == 200
    # a reload that cannot fit (a context past the trained length is capped now: a batch that size is not): the old one stays
    huge = ask(srv, smollm2, options={"num_batch": 1_000_000_000})
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "model_too_big"
    assert [m["context_length"] for m in ps(srv)] == [256]
    threads = ask(srv, smollm2, options={"num_thread": 10_000})  # would start 10,000 llama.cpp threads
    assert threads.status_code == 400 and "options.num_thread" in threads.json()["error"]["message"]  # as the request named it
    assert ask(srv, smollm2, keep_alive=True).status_code == 400
    for body in ({"all": False}, {"model": 3}, {}, {"all": True, "model": "x"}):
        r = httpx.post(srv.url + "/api/stop", json=body)
        assert r.status_code == 400 and "send one of" in r.json()["error"]["message"], body
    # Over HTTP a path must name a .gguf file: an existing other file and a missing one read the same.
    other = tmp_path / "notes.txt"
    other.write_text("secret")
    answers = [ask(srv, p) for p in (str(other), str(tmp_path / "missing.txt"))]
    assert [a.status_code for a in answers] == [404, 404]
    assert [a.json()["error"]["message"].split("'")[2] for a in answers] == [answers[0].json()["error"]["message"].split("'")[2]] * 2
    assert "secret" not in answers[0].text
    # A .gguf file that is no model (cut short): 400 naming it once, in both dialects, as /api/show answers.
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2.read_bytes()[: 1 << 20])
    for url, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}), ("/api/generate", {"prompt": "hi", "stream": False}),
                      ("/api/show", {})):
        r = httpx.post(srv.url + url, json={"model": str(cut), **body}, timeout=60)
        message = r.json()["error"] if url.startswith("/api") else r.json()["error"]["message"]
        assert r.status_code == 400 and "truncated GGUF file" in message and message.count(str(cut)) == 1, (url, r.text)
    assert [m["name"] for m in ps(srv)] == [smollm2.name] and ask(srv, smollm2).status_code == 200
