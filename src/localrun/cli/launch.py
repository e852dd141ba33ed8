"""`localrun launch AGENT [MODEL]`: a coding agent (Claude Code, Codex, OpenCode) pointed at a `localrun serve`
on loopback, as `ollama launch` does: the server is started (or one already answering on the port is used),
the agent's own environment and config name it, the agent runs in the foreground with this terminal, and
the server launch started stops when the agent exits. Everything heavy is imported when the command runs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Annotated, Callable, Optional

import typer
import typer.core

from .options import _context_size

DEFAULT_PORT = 11435  # serve's


@dataclass(frozen=True)
class Agent:
    binary: str
    package: str  # npm package that installs the binary
    ctx: int  # tokens per slot its prompts need: Claude Code's system prompt and tools are ~19k Qwen tokens
    setup: Callable[["Target", str], tuple[dict[str, str], list[str]]]  # (target, scratch dir) -> (env, leading args)


@dataclass(frozen=True)
class Target:
    base_url: str  # http://127.0.0.1:PORT
    model: str  # the name the server lists the model by
    ctx: int
    key: str


def _claude(target: Target, scratch: str) -> tuple[dict[str, str], list[str]]:
    env = {
        "ANTHROPIC_BASE_URL": target.base_url,
        "ANTHROPIC_AUTH_TOKEN": target.key,
        "ANTHROPIC_API_KEY": target.key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        # A 19k-token prompt on a CPU takes minutes before its first token: longer than the SDK's 10 minutes, and
        # than the 5 minutes Claude Code's stream watchdog waits for an event (Anthropic's pings do not count).
        "API_TIMEOUT_MS": os.environ.get("API_TIMEOUT_MS", "3600000"),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": os.environ.get("CLAUDE_STREAM_IDLE_TIMEOUT_MS", "1800000"),
    }
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                 "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):
        env[name] = target.model
    return env, []


def _codex(target: Target, scratch: str) -> tuple[dict[str, str], list[str]]:
    import json

    # -c overrides (TOML values; a JSON string is a TOML basic string) go before any subcommand: codex hands the
    # root's to `exec` and the others. The model is a -c too, since a root -m does not reach `codex exec`.
    config = {
        "model_providers.localrun.name": json.dumps("localrun"),
        "model_providers.localrun.base_url": json.dumps(target.base_url + "/v1"),
        "model_providers.localrun.wire_api": json.dumps("responses"),
        "model_providers.localrun.env_key": json.dumps("OPENAI_API_KEY"),
        # a long prompt is evaluated before any event: Codex's 5 minutes of silence would give up on it
        "model_providers.localrun.stream_idle_timeout_ms": "3600000",
        "model_provider": json.dumps("localrun"),
        "model": json.dumps(target.model),
        "model_context_window": str(target.ctx),
    }
    args = [arg for key, value in config.items() for arg in ("-c", f"{key}={value}")]
    return {"OPENAI_API_KEY": target.key}, args


def _opencode(target: Target, scratch: str) -> tuple[dict[str, str], list[str]]:
    import json

    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "provider": {
            "localrun": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "localrun",
                # timeout: a long prompt is evaluated before the first byte; OpenCode's 5 minutes would give up
                "options": {"baseURL": target.base_url + "/v1", "apiKey": target.key, "timeout": 3600000},
                "models": {target.model: {"name": target.model, "tool_call": True,
                                          "limit": {"context": target.ctx, "output": min(8192, target.ctx // 4)}}},
            }
        },
        "model": f"localrun/{target.model}",
        "small_model": f"localrun/{target.model}",
    }
    path = os.path.join(scratch, "opencode.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return {"OPENCODE_CONFIG": path}, []


AGENTS = {
    "claude": Agent("claude", "@anthropic-ai/claude-code", 32768, _claude),
    "codex": Agent("codex", "@openai/codex", 16384, _codex),
    "opencode": Agent("opencode", "opencode-ai", 16384, _opencode),
}


class LaunchCommand(typer.core.TyperCommand):
    """Everything after `--` belongs to the agent, options included, and never fills MODEL."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            args, ctx.meta["agent_args"] = args[:cut], args[cut + 1:]
        return super().parse_args(ctx, args)


def launch(
    context: typer.Context,
    agent: Annotated[str, typer.Argument(help="the coding agent: claude (Claude Code), codex (Codex CLI) or opencode")],
    model: Annotated[Optional[str], typer.Argument(help="the model to serve (alias, owner/repo[:QUANT] or path); default: the one the server on --port serves")] = None,
    port: Annotated[int, typer.Option("--port", help="the loopback port of the server: one already answering there is used as it is, else one is started")] = DEFAULT_PORT,
    ctx: Annotated[Optional[int], typer.Option("--ctx", "-c", callback=_context_size, help="context window of a server launch starts (default: 32768 for claude, 16384 for codex and opencode)")] = None,
) -> None:
    """Run a coding agent against a local model: localrun launch claude MODEL [-- AGENT ARGS...]."""
    from ..errors import LocalrunError, UsageError

    chosen = AGENTS.get(agent)
    if chosen is None:
        raise UsageError(f"unknown agent {agent!r}: use one of {', '.join(AGENTS)}")
    if not 0 < port <= 65535:
        raise UsageError(f"invalid --port {port}: use 1 to 65535")
    import shutil

    binary = shutil.which(chosen.binary)
    if binary is None:
        raise LocalrunError(f"{chosen.binary} is not installed (not on PATH): npm install -g {chosen.package}")
    key = os.environ.get("LOCALRUN_API_KEY") or "localrun"
    base_url = f"http://127.0.0.1:{port}"
    agent_args = context.meta.get("agent_args", [])
    needed = ctx or chosen.ctx
    server = None if _health(base_url) else _start_server(model, port, needed, base_url)
    try:
        target = Target(base_url, _served_name(base_url, key, model, needed, reused=server is None), needed, key)
        code = _run_agent(binary, chosen, target, agent_args)
    finally:
        if server is not None:
            _stop(server)
    raise typer.Exit(code)


def _health(base_url: str) -> bool:
    """Whether a localrun server answers /health there (it needs no key)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            return json.load(response).get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def _start_server(model: Optional[str], port: int, ctx: int, base_url: str):
    """`localrun serve MODEL` on loopback in its own session (the terminal's Ctrl-C is the agent's, not the
    server's), its log in LOCALRUN_HOME/logs; returned once it answers /health."""
    import subprocess
    import time

    from ..console import notice
    from ..errors import LocalrunError, UsageError
    from ..store.paths import logs_dir

    if model is None:
        raise UsageError(f"no server answers on port {port}: name a MODEL to serve")
    log_path = logs_dir() / f"launch-{port}.log"
    command = [sys.executable, "-m", "localrun.cli.main", "serve", model, "--host", "127.0.0.1", "--port", str(port),
               "--ctx", str(ctx), "--parallel", "1"]
    notice(f"starting localrun serve {model} on port {port} with --ctx {ctx} (log: {log_path})")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        while not _health(base_url):
            if proc.poll() is not None:
                raise LocalrunError(f"localrun serve {model} exited with code {proc.returncode} before answering: "
                                    f"{_last_line(log_path)} (log: {log_path})")
            time.sleep(0.2)
    except BaseException:
        _stop(proc)
        raise
    return proc


def _last_line(path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].removeprefix("error: ") if lines else ""


def _stop(proc) -> None:
    """Stop a server launch started: Ctrl-C (a graceful stop), then a kill if it does not go."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _served_name(base_url: str, key: str, model: Optional[str], ctx: int, reused: bool) -> str:
    """The name the server lists the model by (a path model is listed by its file name), which the agent must
    send; on a server launch did not start, a notice where its context is smaller than the agent needs."""
    import json
    import urllib.request

    from ..console import notice
    from ..errors import UsageError

    request = urllib.request.Request(base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            listed = json.load(response).get("data", [])
    except (OSError, ValueError):
        listed = []
    wanted = None if model is None else os.path.realpath(model) if os.path.exists(model) else model
    found = next((m for m in listed if wanted is not None and wanted in (m.get("id"), (m.get("meta") or {}).get("file"))), None)
    if found is None and (model is None or not reused):
        found = next((m for m in listed if (m.get("meta") or {}).get("loaded")), None)
    if found is None:
        if model is None:
            raise UsageError(f"the server on {base_url} has no model loaded: name a MODEL")
        return model
    slot_ctx = (found.get("meta") or {}).get("n_ctx_slot")
    if reused and isinstance(slot_ctx, int) and slot_ctx < ctx:
        notice(f"the server on {base_url} gives {found['id']} {slot_ctx} tokens per slot, less than the {ctx} the agent "
               "needs: stop it, or pass another --port to start one")
    return found["id"]


def _run_agent(binary: str, agent: Agent, target: Target, agent_args: list[str]) -> int:
    """The agent in the foreground with this terminal; its exit code (128+N for a signal N). Ctrl-C is the
    agent's to handle (it reaches it from the terminal); a SIGTERM or SIGHUP to launch is passed on to it."""
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="localrun-launch-") as scratch:
        env, leading = agent.setup(target, scratch)
        proc = subprocess.Popen([binary, *leading, *agent_args], env={**os.environ, **env})

        def pass_on(signum, frame):
            if proc.poll() is None:
                proc.send_signal(signum)

        # handlers, not SIG_IGN: an ignored signal would stay ignored in the agent; these are reset at its exec
        previous = {signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: None)}
        previous.update({s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGHUP)})
        try:
            code = proc.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    return 128 - code if code < 0 else code
