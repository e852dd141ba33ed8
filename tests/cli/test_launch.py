"""`localrun launch AGENT`: stand-in agents (tiny scripts named claude, codex and opencode, first on PATH) print
what they were given and make one real request with the official client to the real server launch started
with the real SmolLM2; launch returns the agent's exit code and leaves no server behind."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LOCALRUN, run_cli, start_server

# What every stand-in does first: print its arguments and the environment launch set, as one JSON line.
PRELUDE = """\
#!{python}
import json, os, sys
NAMES = ("ANTHROPIC", "CLAUDE_CODE", "CLAUDE_STREAM", "DISABLE_TELEMETRY", "API_TIMEOUT_MS", "OPENAI_API_KEY", "OPENCODE_CONFIG")
seen = {{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith(NAMES)}}}}
"""

CLAUDE = """
import anthropic
client = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=os.environ["ANTHROPIC_API_KEY"], max_retries=0)
raw = client.messages.with_raw_response.create(model=os.environ["ANTHROPIC_MODEL"], max_tokens=8,
                                               messages=[{"role": "user", "content": "Say hi"}])
seen["status"], seen["answer"] = raw.status_code, raw.parse().content[0].text
"""

CODEX = """
import tomllib, openai
pairs = [a.split("=", 1) for a in sys.argv[1:] if "=" in a]
config = {k: tomllib.loads("v = " + v)["v"] for k, v in pairs}
seen["config"] = config
client = openai.OpenAI(base_url=config["model_providers.localrun.base_url"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
raw = client.responses.with_raw_response.create(model=config["model"], input="Say hi", max_output_tokens=8)
seen["status"], seen["answer"] = raw.status_code, raw.parse().output_text
"""

OPENCODE = """
import openai
config = json.load(open(os.environ["OPENCODE_CONFIG"]))
seen["config"] = config
provider, model = config["model"].split("/", 1)
options = config["provider"][provider]["options"]
client = openai.OpenAI(base_url=options["baseURL"], api_key=options["apiKey"], max_retries=0)
raw = client.chat.completions.with_raw_response.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Say hi"}])
seen["status"], seen["answer"] = raw.status_code, raw.parse().choices[0].message.content
"""

EPILOGUE = """
print(json.dumps(seen), flush=True)
if os.environ.get("STANDIN_WAIT"):
    import time
    time.sleep(600)
sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))
"""

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def agents(tmp_path) -> Path:
    """A folder holding the three stand-ins."""
    folder = tmp_path / "agents"
    folder.mkdir()
    for name, body in (("claude", CLAUDE), ("codex", CODEX), ("opencode", OPENCODE)):
        path = folder / name
        path.write_text(PRELUDE.format(python=sys.executable) + textwrap.dedent(body) + EPILOGUE)
        path.chmod(0o755)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(port: int) -> list:
    """`localrun serve` processes listening on this port (by their arguments)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "serve" in cmdline and "--port" in cmdline and cmdline[cmdline.index("--port") + 1:][:1] == [str(port)]:
            found.append(proc)
    return found


def launch(agents: Path, *args: str, exit_code: int = 0, path: str | None = None):
    env = {"PATH": path if path is not None else f"{agents}{os.pathsep}{os.environ['PATH']}", "STANDIN_EXIT": str(exit_code)}
    env = {**env, "ANTHROPIC_API_KEY": "the user's real key", "OPENAI_API_KEY": "the user's real key"}
    return run_cli("launch", *args, env=env)


def seen_by_agent(result) -> dict:
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr
    return json.loads(lines[-1])


def test_claude_gets_its_environment_and_the_server_answers(agents, smollm2):
    port = free_port()
    result = launch(agents, "claude", str(smollm2), "--port", str(port), "--ctx", "2048", "--", "-p", "fix it", "--verbose", exit_code=7)
    assert result.returncode == 7, result.stderr
    seen = seen_by_agent(result)
    assert seen["argv"] == ["-p", "fix it", "--verbose"]
    env = seen["env"]
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"
    assert env["ANTHROPIC_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == "localrun"  # a dummy, never the user's real key
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                 "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
        assert env[name] == SMOL  # a path model goes by the name the server lists
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == env["DISABLE_TELEMETRY"] == "1"
    assert int(env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"]) > 300_000  # its watchdog's default gave up on a long prompt
    assert seen["status"] == 200 and seen["answer"]
    assert f"starting localrun serve {smollm2} on port {port} with --ctx 2048" in " ".join(result.stderr.split())
    assert not serving(port)


def test_codex_gets_a_responses_provider(agents, smollm2):
    port = free_port()
    result = launch(agents, "codex", str(smollm2), "--port", str(port), "--ctx", "2048", "--", "exec", "fix it")
    assert result.returncode == 0, result.stderr
    seen = seen_by_agent(result)
    assert seen["argv"][-2:] == ["exec", "fix it"]  # the overrides come before the subcommand: codex hands them on
    config = seen["config"]
    assert config["model_provider"] == "localrun"
    assert config["model_providers.localrun.base_url"] == f"http://127.0.0.1:{port}/v1"
    assert config["model_providers.localrun.wire_api"] == "responses"
    assert config["model_providers.localrun.env_key"] == "OPENAI_API_KEY"
    assert config["model"] == SMOL and config["model_context_window"] == 2048
    assert seen["env"]["OPENAI_API_KEY"] == "localrun"
    assert seen["status"] == 200 and seen["answer"]
    assert not serving(port)


def test_opencode_gets_a_config_file(agents, smollm2):
    port = free_port()
    result = launch(agents, "opencode", str(smollm2), "--port", str(port), "--ctx", "2048", "--", "run", "fix it")
    assert result.returncode == 0, result.stderr
    seen = seen_by_agent(result)
    assert seen["argv"] == ["run", "fix it"]
    config = seen["config"]
    provider = config["provider"]["localrun"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == f"http://127.0.0.1:{port}/v1"
    assert config["model"] == f"localrun/{SMOL}" and provider["models"][SMOL]["limit"]["context"] == 2048
    assert seen["status"] == 200 and seen["answer"]
    assert not Path(seen["env"]["OPENCODE_CONFIG"]).exists()  # the config was launch's scratch
    assert not serving(port)


def test_a_server_already_answering_is_used_and_left_running(agents, smollm2, isolated_home):
    server = start_server(smollm2, isolated_home, "--ctx", "1024", "--parallel", "1")
    try:
        result = launch(agents, "codex", "--port", str(server.port), "--", "exec", "hi", exit_code=3)
        assert result.returncode == 3, result.stderr
        seen = seen_by_agent(result)
        assert seen["config"]["model"] == SMOL  # no MODEL: the one the server serves
        assert seen["status"] == 200
        assert "starting" not in result.stderr
        assert "1024 tokens per slot, less than the 16384" in " ".join(result.stderr.split())
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_a_terminated_launch_ends_the_agent_and_its_server(agents, smollm2):
    import signal
    import subprocess

    from conftest import wait_until

    port = free_port()
    env = {**os.environ, "PATH": f"{agents}{os.pathsep}{os.environ['PATH']}", "STANDIN_WAIT": "1"}
    proc = subprocess.Popen([LOCALRUN, "launch", "claude", str(smollm2), "--port", str(port), "--ctx", "2048"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline())["status"] == 200  # the agent is running and has its answer
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:  # launch did not end: neither it nor anything it started may stay
            import psutil

            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
        proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM  # passed on to the agent, which it ended
    wait_until(lambda: not serving(port), what="the server to stop", timeout=30)


def test_a_missing_agent_is_one_line(agents, smollm2, tmp_path):
    port = free_port()
    result = launch(agents, "opencode", str(smollm2), "--port", str(port), path=str(tmp_path / "empty"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["error: opencode is not installed (not on PATH): npm install -g opencode-ai"]
    assert not serving(port)


def test_a_server_that_cannot_start_is_one_line(agents, tmp_path):
    port = free_port()
    result = launch(agents, "claude", str(tmp_path / "nothing.gguf"), "--port", str(port))
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "exited with code" in error[0] and "log:" in error[0]
    assert "{" not in result.stdout  # the agent never ran
    assert not serving(port)


def test_an_unknown_agent_is_bad_usage(agents):
    result = launch(agents, "aider", "x")
    assert result.returncode == 2
    assert "unknown agent 'aider'" in result.stderr
