"""`localrun serve` for clients beyond this machine's user: HTTPS with a certificate made here (the real `openai`
client verifying it with its own httpx context), several API keys from --api-key-file (each accepted, none a 401 in
OpenAI's, Anthropic's and Ollama's shapes), and the flags' mistakes said in one line before any model loads."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import signal
import ssl
import subprocess
import threading
import time

import httpx
import pytest

from conftest import LOCALRUN, Server, run_cli

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
KEYS = ("first-key-abc", "second-key-def")


def make_certificate(folder) -> tuple:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files (cryptography)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localrun test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return certfile, keyfile


def start_https(model, home, *args: str) -> Server:
    """`localrun serve` on a free loopback port, as conftest.start_server, for a server that says https://."""
    env = {**os.environ, "LOCALRUN_HOME": str(home)}
    proc = subprocess.Popen([LOCALRUN, "serve", str(model), "--port", "0", "--threads", "1", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"https://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            drain = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
            drain.start()
            server = Server(proc, int(m.group(1)), lines, drain)
            server.url = f"https://127.0.0.1:{server.port}"
            return server
    proc.kill()
    proc.wait()
    raise AssertionError(f"server did not start: {''.join(lines)}")


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile = make_certificate(folder)
    key_file = folder / "keys.txt"
    key_file.write_text(f"# the team's keys\n{KEYS[0]}\n\n   # the CI's\n  {KEYS[1]}  \n")
    return certfile, keyfile, key_file


@pytest.fixture(scope="module")
def server(smollm2, tls, tmp_path_factory):
    certfile, keyfile, key_file = tls
    with start_https(smollm2, tmp_path_factory.mktemp("home"), "--ctx", "512", "--parallel", "2", "--api-key-file", str(key_file),
                     "--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)) as srv:
        yield srv


def test_https_with_each_key_of_the_file(server, tls):
    certfile = tls[0]
    context = ssl.create_default_context(cafile=str(certfile))  # the test's certificate is the only one trusted
    for key in KEYS:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120,
                               http_client=httpx.Client(verify=context))
        answer = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Say hi."}],
                                                max_tokens=4, temperature=0)
        assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
    # The certificate is checked: a client that does not trust it is refused by its own TLS, not answered.
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=30).models.list()
    with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP to the HTTPS port is not served
        httpx.get(server.url.replace("https://", "http://") + "/health", timeout=30)


def test_a_request_with_none_of_the_keys_is_a_401_in_each_dialect(server, tls):
    context = ssl.create_default_context(cafile=str(tls[0]))
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=server.url + "/v1", api_key="not-a-key", max_retries=0, timeout=30,
                      http_client=httpx.Client(verify=context)).models.list()
    assert refused.value.body["code"] == "invalid_api_key"
    claude = anthropic.Anthropic(base_url=server.url, api_key="not-a-key", max_retries=0, timeout=30,
                                 http_client=anthropic.DefaultHttpxClient(verify=context))  # (its own httpx)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        claude.messages.create(model=SMOL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server.url, verify=context).chat(model=SMOL, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401 and "API key" in refused.value.error
    raw = httpx.post(server.url + "/api/chat", json={"model": SMOL, "messages": []}, verify=context)
    assert raw.status_code == 401 and list(raw.json()) == ["error"]  # Ollama's shape: {"error": "..."}
    # /health stays open (a load balancer's probe), with no key
    assert httpx.get(server.url + "/health", verify=context).json()["status"] == "ok"


@pytest.mark.parametrize("case", ["missing key file", "empty key file", "cert without its key", "key without cert",
                                  "not a certificate", "bad origin"])
def test_bad_flags_are_one_line_and_exit_2(case, tls, tmp_path, smollm2):
    certfile, keyfile, _ = tls
    empty = tmp_path / "empty.txt"
    empty.write_text("# nobody yet\n\n")
    args, said = {
        "missing key file": (["--api-key-file", str(tmp_path / "nope.txt")], "cannot read --api-key-file"),
        "empty key file": (["--api-key-file", str(empty)], "has no key"),
        "cert without its key": (["--ssl-certfile", str(certfile)], "--ssl-certfile"),
        "key without cert": (["--ssl-keyfile", str(keyfile)], "--ssl-keyfile needs --ssl-certfile"),
        "not a certificate": (["--ssl-certfile", str(empty), "--ssl-keyfile", str(keyfile)], "not a PEM certificate"),
        "bad origin": (["--allowed-origins", "http://a.example/path"], "invalid allowed origin"),
    }[case]
    result = run_cli("serve", str(smollm2), "--port", "0", *args, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in result.stderr, result.stderr
