"""`localrun chat` with images (#34): `/image PATH`, a path named in a message, the images kept in the
conversation (their KV reused on the next turn, not encoded again) and in a session, in-process and through the
background server. SmolLM2-135M with the random-weight projector of tests/projector.py: the answers mean
nothing, so each is compared token for token (greedy text) with `run --image`'s for the same image and question."""

from __future__ import annotations


import pytest

from localrun.cli.chat import image_paths_in
from test_chat import stats, term  # noqa: F401 - term: a fixture
from conftest import last_json

ARGS = ("-t", "0", "-n", "8", "--ctx", "512", "--threads", "1")
QUESTION = "Look at this picture carefully and describe it"


@pytest.fixture(scope="module")
def run_answer(smollm2, image_files, tmp_path_factory):
    """`run --image FILE QUESTION`'s greedy answer, in-process (both runs in one process: tests/one_process.py)."""
    from one_process import run_all

    names = ("red.png", "my stripes.png")
    runs = run_all(*[["run", smollm2, "--mmproj", image_files / "mmproj-test.gguf", "--image", image_files / name, *ARGS, "--no-cache", QUESTION]
                     for name in names], home=tmp_path_factory.mktemp("run-answer"))
    for r in runs:
        assert r.returncode == 0, r.stderr
    return {name: r.stdout.strip() for name, r in zip(names, runs)}


_UNSAVED: dict = {}  # the chat that asks the saved session's questions without one (in-process, greedy): once a module


def chat(cli, smollm2, image_files, *lines: str, extra=()):
    r = cli("chat", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), *ARGS, "-v", *extra, input="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r


def stats_blocks(stderr: str) -> list[dict]:
    return [stats(block) for block in stderr.split("load duration:")[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("via", ["in-process", "server"])
def test_chat_answers_about_images_as_run_does_and_keeps_them(cli, smollm2, image_files, run_answer, via, request):
    if via == "server":
        request.getfixturevalue("resident")
    red, striped = image_files / "red.png", image_files / "my stripes.png"
    r = chat(cli, smollm2, image_files,
             f"/image {red}", QUESTION,  # attached, then asked about
             "And what else?",  # the image stays in the prompt: its KV is reused
             f"{image_files / 'broken.png'} what is this?",  # a bad image: one line, the chat goes on
             "/clear", f"'{striped}' {QUESTION}",  # a quoted path in the message (with a space in it)
             "/save pics")
    answers = r.stdout.split("\n")[:-1]
    assert answers[0] == run_answer["red.png"]
    assert answers[2] == ""  # the failed message's line
    assert answers[3] == run_answer["my stripes.png"]
    first, second, third = stats_blocks(r.stderr)
    assert first["cached"] == 0
    assert second["cached"] == first["prompt"] + first["generated"] - 1  # the image and the first exchange not evaluated again
    broken = [line for line in r.stderr.splitlines() if "broken.png" in line and "error" in line]
    assert len(broken) == 1 and "not an image" in broken[0]
    assert f"added image {striped}" in r.stderr
    if via == "server":
        from test_chat import served

        served(via)

    # The session keeps the image: resumed in this process (saved by the server in the other case), its KV is
    # restored (the image is not encoded again) and it answers as the chat that saved it would have.
    resumed = chat(cli, smollm2, image_files, "And what else?", extra=["--session", "pics", "--keep-alive", "0"])
    if "same" not in _UNSAVED:  # (the same for both `via`: in-process)
        _UNSAVED["same"] = chat(cli, smollm2, image_files, f"/image {striped}", QUESTION, "And what else?", extra=["--keep-alive", "0"])
    same = _UNSAVED["same"]
    assert resumed.stdout == same.stdout.split("\n", 1)[1]
    assert stats_blocks(resumed.stderr)[0]["cached"] >= third["prompt"]
    # `run --session` goes on with the same session: its images come back from it (no --image given).
    ran = cli("run", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), *ARGS, "--session", "pics", "--json", "Anything else?")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert last_json(ran.stdout)["stats"]["cached_tokens"] >= third["prompt"]


@pytest.mark.slow
def test_image_command(cli, smollm2, image_files):
    r = chat(cli, smollm2, image_files, "/image", f"/image {image_files / 'red.png'}", f"/image {image_files / 'nothere.png'}", "/image",
             "/image clear", "/image", "/show")
    lines = r.stderr.splitlines()
    assert r.stdout == ""
    assert [line for line in lines if "nothere.png" in line] == [f"error: {image_files / 'nothere.png'}: no such file"]
    assert lines.count("no image attached: /image PATH attaches one to the next message") == 2
    assert f"{image_files / 'red.png'} (1 KB)" in lines and "dropped 1 attached image(s)" in lines


def test_image_paths_named_in_a_message(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "my photo (1).JPG").write_bytes(b"")
    a, photo = tmp_path / "a.png", tmp_path / "my photo (1).JPG"
    assert image_paths_in(f"look at {a} please") == ("look at please", [str(a)])
    assert image_paths_in(f"{a}, and then?") == (", and then?", [str(a)])
    assert image_paths_in(f"'{photo}' what is it?") == ("what is it?", [str(photo)])
    escaped = str(photo).replace(" ", "\\ ").replace("(", "\\(").replace(")", "\\)")
    assert image_paths_in(f"compare {escaped} with {a}.") == ("compare with .", [str(photo), str(a)])
    for text in (f"{tmp_path}/none.png here", "see https://example.com/a.png", f"x{a}", "a .png file"):
        assert image_paths_in(text) == (text, [])


@pytest.mark.slow
def test_in_a_terminal(smollm2, image_files, run_answer, term):
    """Typed in a terminal: /image, the answer streamed as run's, a line starting with an image's path is a
    message (not an unknown command), and /show counts the images kept."""
    t = term(smollm2, "--mmproj", str(image_files / "mmproj-test.gguf"), *ARGS)
    assert t.say(f"/image {image_files / 'red.png'}").strip() == f"attached {image_files / 'red.png'} (1 KB) to the next message"
    assert t.say(QUESTION).strip() == run_answer["red.png"]
    said = t.say(f"{image_files / 'broken.png'} what is it?").strip().splitlines()
    assert said[0] == f"added image {image_files / 'broken.png'}" and said[1].startswith(f"error: {image_files / 'broken.png'}: not an image")
    assert "conversation: 1 turn(s) (1 image(s))" in t.say("/show")
    assert t.bye() == 0
