"""Real coding agents against localrun, end to end: Claude Code (`claude -p`), Codex (`codex exec`) and OpenCode
(`opencode run`), installed from npm into a scratch prefix, each run through `localrun launch` in a scratch
git repo and asked for one small edit, one at a time, with a time limit each.

A recording proxy sits between the agent and the server (`launch --port` points at it, and launch uses the
server that answers there): every request's method, path, body size, status, answer size and time is kept,
each request body is saved, and a 4xx/5xx answer's body is printed. The server's own access log (prompt and
generated tokens per request) is printed beside it.

    .venv/bin/python scripts/agent_e2e.py [--agents claude,codex,opencode] [--limit 600] [--out DIR]

Slow on a CPU: Claude Code's prompt is ~19k tokens, Codex's ~8.5k, and each is evaluated before any answer."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCALRUN = str(Path(sys.executable).with_name("localrun"))
MODEL = Path.home() / ".cache" / "localrun-test-models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}

BUGGY = "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a - b\n"
TASK = "calc.py has a bug: add(a, b) returns a - b. Edit calc.py so that add returns a + b. Change nothing else."


def agent_args(agent: str, repo: Path) -> list[str]:
    """The agent's own non-interactive command line, after `localrun launch AGENT MODEL --`."""
    if agent == "claude":
        return ["-p", TASK, "--permission-mode", "acceptEdits", "--max-turns", "8", "--verbose", "--output-format", "stream-json"]
    if agent == "codex":
        return ["exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "-C", str(repo), TASK]
    return ["run", "--dir", str(repo), "--print-logs", "--log-level", "INFO", TASK]


def agent_env(agent: str, scratch: Path) -> dict[str, str]:
    """Each agent's own state in the scratch folder, not the user's."""
    if agent == "claude":
        return {"CLAUDE_CONFIG_DIR": str(scratch / "claude-config")}
    if agent == "codex":
        (scratch / "codex-home").mkdir(exist_ok=True)
        return {"CODEX_HOME": str(scratch / "codex-home")}
    return {f"XDG_{kind}_HOME": str(scratch / f"xdg-{kind.lower()}") for kind in ("CONFIG", "DATA", "CACHE", "STATE")}


# -- the recording proxy ---------------------------------------------------------------------------------

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host"}


class Recorder:
    def __init__(self, folder: Path):
        self.folder, self.lock, self.records, self.agent = folder, threading.Lock(), [], "-"
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, record: dict, body: bytes) -> None:
        with self.lock:
            record["n"], record["agent"] = len(self.records) + 1, self.agent
            self.records.append(record)
            name = re.sub(r"[^A-Za-z0-9]+", "_", record["path"]).strip("_")[:60]
            if body:
                (self.folder / f"{record['n']:03d}-{self.agent}-{name}.json").write_bytes(body)
            with open(self.folder / "requests.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        print(f"  [{record['agent']}] {record['method']} {record['path']} {record['request_bytes']} B -> {record['status']} "
              f"{record['response_bytes']} B in {record['seconds']:.1f} s", file=sys.stderr, flush=True)
        if record.get("error_body"):
            print(f"    body: {record['error_body']}", file=sys.stderr, flush=True)


def make_proxy(upstream: int, recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # the recorder says it instead
            pass

        def forward(self):
            started = time.monotonic()
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = b""
                while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            record = {"method": self.command, "path": self.path, "request_bytes": len(body), "status": None, "response_bytes": 0}
            print(f"  [{recorder.agent}] {self.command} {self.path} {len(body)} B ...", file=sys.stderr, flush=True)
            upstream_conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=3600)
            done = threading.Event()
            self.client_went_away = False
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP | {"content-length"}}
                upstream_conn.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT") else None,
                                      headers=headers)
                watching = threading.Thread(target=self.close_upstream_when_client_goes, args=(upstream_conn, done), daemon=True)
                watching.start()
                response = upstream_conn.getresponse()
                record["status"] = response.status
                self.send_response_only(response.status, response.reason)
                length = response.getheader("Content-Length")
                for k, v in response.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                if length is None:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                kept = b""
                while chunk := response.read1(65536):
                    record["response_bytes"] += len(chunk)
                    if response.status >= 400 and len(kept) < 4000:
                        kept += chunk
                    self.wfile.write(chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                if length is None:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                done.set()  # a client that hangs up from here on has its whole answer
                if kept:
                    record["error_body"] = kept[:4000].decode(errors="replace")
            except (BrokenPipeError, ConnectionResetError, http.client.HTTPException):
                record["client_gone"] = True
                self.close_connection = True
            except OSError as exc:
                record["proxy_error"] = repr(exc)
                self.close_connection = True
            finally:
                done.set()
                upstream_conn.close()
                record["seconds"] = round(time.monotonic() - started, 2)
                if getattr(self, "client_went_away", False):
                    record["client_gone"], self.close_connection = True, True
                recorder.add(record, body)

        def close_upstream_when_client_goes(self, upstream_conn, done: threading.Event) -> None:
            """A client that hangs up closes the server's connection too, as it would without the proxy in between
            (the server may be silent meanwhile: a non-streamed answer, a long prompt)."""
            while not done.is_set():
                readable, _, _ = select.select([self.connection], [], [], 1.0)
                if not readable:
                    continue
                try:
                    peeked = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    peeked = b""
                if not peeked:
                    self.client_went_away = not done.is_set()
                    with contextlib.suppress(OSError, AttributeError):  # AttributeError: the answer ended meanwhile
                        upstream_conn.sock.shutdown(socket.SHUT_RDWR)
                    return
                time.sleep(1)  # the client's next request, already sent: not a hang-up

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = forward

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client hanging up between requests is no news
            if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- processes ----------------------------------------------------------------------------------------------


def stop_tree(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the process (launch passes it to the agent), then SIGKILL to it and every descendant, by pid."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def start_server(log_path: Path, home: Path) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "LOCALRUN_HOME": str(home)}
    log = open(log_path, "w")
    proc = subprocess.Popen([LOCALRUN, "serve", str(MODEL), "--port", "0", "--ctx", "32768", "--parallel", "1"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", log_path.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1))
        time.sleep(0.5)
    stop_tree(proc)
    sys.exit(f"the server did not start: {log_path.read_text(errors='replace')[-2000:]}")


def install(prefix: Path, agents: list[str]) -> Path:
    bin_dir = prefix / "node_modules" / ".bin"
    missing = [PACKAGES[a] for a in agents if not (bin_dir / a).exists()]
    if missing:
        print(f"npm install --prefix {prefix} {' '.join(missing)}", file=sys.stderr, flush=True)
        subprocess.run(["npm", "install", "--prefix", str(prefix), *missing], check=True, stdout=sys.stderr)
    for agent in agents:
        version = subprocess.run([str(bin_dir / agent), "--version"], capture_output=True, text=True, timeout=60)
        print(f"{agent}: {(version.stdout or version.stderr).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
    return bin_dir


def scratch_repo(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "calc.py").write_text(BUGGY)
    git = ["git", "-C", str(folder), "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "calc.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "buggy add"], check=True)
    return folder


def run_agent(agent: str, bin_dir: Path, proxy_port: int, scratch: Path, limit: float, recorder: Recorder, server_log: Path) -> dict:
    repo = scratch_repo(scratch / f"repo-{agent}")
    recorder.agent = agent
    log_offset = server_log.stat().st_size
    # PWD as a shell would set it: OpenCode takes its project folder from PWD, not from the process's cwd
    env = {**os.environ, **agent_env(agent, scratch), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "LOCALRUN_HOME": str(scratch / "launch-home"), "PWD": str(repo)}
    command = [LOCALRUN, "launch", agent, str(MODEL), "--port", str(proxy_port), "--", *agent_args(agent, repo)]
    print(f"\n== {agent}: {' '.join(command[:6])} -- ... (limit {limit:.0f} s)", file=sys.stderr, flush=True)
    out_path = scratch / f"{agent}.out"
    started = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(command, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # the time limit, or this script stopped
            stop_tree(proc)
        code = proc.returncode
    seconds = time.monotonic() - started
    time.sleep(2)  # the proxy records a request its client hung up on within a second
    diff = subprocess.run(["git", "-C", str(repo), "diff"], capture_output=True, text=True).stdout
    check = subprocess.run([sys.executable, "-c", "from calc import add; print(add(2, 3))"], cwd=repo, capture_output=True, text=True)
    with open(server_log, errors="replace") as f:
        f.seek(log_offset)
        access = [line.rstrip() for line in f if line.startswith("[access]")]
    return {"agent": agent, "exit_code": code, "timed_out": timed_out, "seconds": round(seconds, 1),
            "edit_landed": check.stdout.strip() == "5", "add(2, 3)": (check.stdout or check.stderr).strip()[-200:],
            "diff": diff, "requests": [r for r in recorder.records if r["agent"] == agent], "access_log": access,
            "output_tail": out_path.read_text(errors="replace")[-3000:]}


def report(result: dict) -> None:
    print(f"\n=== {result['agent']}: exit {result['exit_code']}{' (time limit)' if result['timed_out'] else ''} after "
          f"{result['seconds']} s; edit landed: {result['edit_landed']} (add(2, 3) -> {result['add(2, 3)']})")
    print("requests (method path: request bytes -> status, answer bytes, seconds):")
    for r in result["requests"]:
        extra = " client went away" if r.get("client_gone") else f" {r['proxy_error']}" if r.get("proxy_error") else ""
        print(f"  {r['n']:3d} {r['method']} {r['path']}: {r['request_bytes']} B -> {r['status']}, {r['response_bytes']} B, "
              f"{r['seconds']} s{extra}")
        if r.get("error_body"):
            print(f"      body: {r['error_body'][:1500]}")
    print("server access log:")
    for line in result["access_log"]:
        print(f"  {line}")
    print("diff:" if result["diff"] else "diff: (none)")
    print("".join(f"  {line}\n" for line in result["diff"].splitlines()), end="")
    print("agent output (tail):")
    print("".join(f"  {line}\n" for line in result["output_tail"].splitlines()[-25:]), end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="claude,codex,opencode")
    parser.add_argument("--limit", type=float, default=600, help="seconds each agent may take")
    parser.add_argument("--npm-prefix", type=Path, default=Path.home() / ".cache" / "localrun-agents")
    parser.add_argument("--out", type=Path, help="where requests, bodies and logs are kept (default: a temporary folder)")
    args = parser.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    if unknown := [a for a in agents if a not in PACKAGES]:
        sys.exit(f"unknown agents: {unknown}")
    if not MODEL.exists():
        sys.exit(f"{MODEL} is missing: run the tests that use the qwen fixture once (tests/conftest.py fetches it)")
    bin_dir = install(args.npm_prefix, agents)
    scratch = args.out or Path(tempfile.mkdtemp(prefix="agent-e2e-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"scratch: {scratch}", file=sys.stderr, flush=True)
    server_log = scratch / "server.log"
    server, port = start_server(server_log, scratch / "serve-home")
    recorder = Recorder(scratch / "requests")
    proxy = make_proxy(port, recorder)
    results = []
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the finally below still runs
    try:
        for agent in agents:
            results.append(run_agent(agent, bin_dir, proxy.server_address[1], scratch, args.limit, recorder, server_log))
            report(results[-1])
    finally:
        proxy.shutdown()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    (scratch / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nsummary ({scratch}/results.json):")
    for r in results:
        statuses = sorted({str(q["status"]) for q in r["requests"]})
        print(f"  {r['agent']:8s} exit {r['exit_code']}{' (time limit)' if r['timed_out'] else ''}, {len(r['requests'])} requests "
              f"(statuses {', '.join(statuses) or '-'}), edit landed: {r['edit_landed']}")


if __name__ == "__main__":
    main()
