"""`localrun run --image` end to end: the installed command, SmolLM2-135M with a random-weight projector made
here (tests/projector.py), real llama.cpp. The answers mean nothing; they must depend on the image."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import LOCALRUN
from one_process import run_all
from projector import IMAGE_SIZE, PATCH_SIZE, write_projector

pytestmark = pytest.mark.slow

N_IMAGE = (IMAGE_SIZE // PATCH_SIZE) ** 2
# Long enough (with the image) for the prefix cache, which keeps prompts of 64 tokens or more.
QUESTION = ("Look at this picture carefully and describe every detail you can see in it: the colours, the shapes,"
            " the textures, the light, and anything else about it that stands out")
GREEDY = ("--temperature", "0", "--max-tokens", "10", "--ctx", "512", "--json")


def done(stdout: str) -> dict:
    events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert events[-1]["type"] == "done"
    return events[-1]


def asking(model, image_files, *images: str, question: str = QUESTION, extra=()) -> list[str]:
    """The arguments of `localrun run` that ask `question` about `images` (file names in image_files)."""
    args = [a for name in images for a in ("--image", str(image_files / name))]
    return ["run", str(model), "--mmproj", str(image_files / "mmproj-test.gguf"), *args, *GREEDY, *extra, question]


def answered(r) -> dict:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return done(r.stdout)


def ask(cli, model, image_files, *images: str, question: str = QUESTION, extra=()) -> dict:
    return answered(cli(*asking(model, image_files, *images, question=question, extra=extra)))


def test_the_answer_depends_on_the_image(smollm2, image_files, isolated_home):
    *answers, text_only = run_all(*[asking(smollm2, image_files, name, extra=["--no-cache"]) for name in ("red.png", "stripes.png", "red.png")],
                                  ["run", smollm2, *GREEDY, "--no-cache", QUESTION], home=isolated_home)
    red, striped, red_again = map(answered, answers)
    assert red["tokens"] != striped["tokens"]  # two images, two answers
    assert red_again["tokens"] == red["tokens"]  # the same image, the same answer
    assert text_only.returncode == 0, text_only.stderr
    assert red["stats"]["prompt_tokens"] == done(text_only.stdout)["stats"]["prompt_tokens"] + N_IMAGE


def test_a_second_run_on_the_same_image_reuses_its_kv(cli, smollm2, image_files):
    first = ask(cli, smollm2, image_files, "stripes.png")
    second = ask(cli, smollm2, image_files, "stripes.png")  # the prefix cache holds the image's KV from the first run
    assert second["tokens"] == first["tokens"]
    assert first["stats"]["cached_tokens"] == 0
    assert second["stats"]["cached_tokens"] == second["stats"]["prompt_tokens"] - 1
    other = ask(cli, smollm2, image_files, "red.png")  # another image: only the text before it is shared
    assert other["stats"]["cached_tokens"] < 10


def test_several_images_in_order(smollm2, image_files, isolated_home):
    both, swapped, one = map(answered, run_all(*[asking(smollm2, image_files, *names, extra=["--no-cache"]) for names in (
        ("red.png", "stripes.png"), ("stripes.png", "red.png"), ("red.png",))], home=isolated_home))
    assert both["stats"]["prompt_tokens"] == one["stats"]["prompt_tokens"] + N_IMAGE
    assert both["tokens"] != swapped["tokens"]


def test_the_projector_beside_the_model_is_found(cli, smollm2, image_files, tmp_path, isolated_home):
    (tmp_path / smollm2.name).symlink_to(smollm2)
    write_projector(tmp_path / "mmproj-SmolLM2-f16.gguf")  # the same weights (seed) as image_files' projector
    r, given = run_all(["run", tmp_path / smollm2.name, "--image", image_files / "red.png", *GREEDY, "--no-cache", QUESTION],
                       asking(smollm2, image_files, "red.png", extra=["--no-cache"]), home=isolated_home)
    assert r.returncode == 0, r.stderr
    assert done(r.stdout)["tokens"] == answered(given)["tokens"]
    write_projector(tmp_path / "mmproj-SmolLM2-q8.gguf", seed=1)
    r = cli("run", str(tmp_path / smollm2.name), "--image", str(image_files / "red.png"), *GREEDY, QUESTION)
    assert r.returncode == 2
    assert "2 projectors beside" in r.stderr and "--mmproj" in r.stderr


def one_line_error(r, code: int) -> str:
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert r.stdout == ""
    return lines[0]


USAGE_ERRORS = [
    (["--image", "{files}/red.png"], "no image projector beside it"),  # no --mmproj, none beside the model
    (["--mmproj", "{files}/none.gguf", "--image", "{files}/red.png"], "invalid --mmproj"),
    (["--mmproj", "{files}/mmproj-test.gguf", "--image", "{files}/red.png", "--beams", "2"], "--beams"),
]
REFUSED = {  # name -> the arguments of `run MODEL ... QUESTION` that are refused ({files}: image_files)
    "corrupt": ["--mmproj", "{files}/mmproj-test.gguf", "--image", "{files}/broken.png"],
    "missing": ["--mmproj", "{files}/mmproj-test.gguf", "--image", "{files}/nothere.png"],
    "wrong projector": ["--mmproj", "{wide}", "--image", "{files}/red.png"],
    **{" ".join(args): args for args, _ in USAGE_ERRORS},
}


@pytest.fixture(scope="module")
def refused(smollm2, image_files, tmp_path_factory) -> dict:
    """Each of REFUSED's commands, run in one process: name -> its Result."""
    where = tmp_path_factory.mktemp("refused")
    wide = write_projector(where / "mmproj-wide.gguf", n_embd_text=2048)  # a projector for another model
    runs = run_all(*[["run", smollm2, *[a.format(files=image_files, wide=wide) for a in args], *GREEDY, QUESTION] for args in REFUSED.values()],
                   home=where / "home")
    return dict(zip(REFUSED, runs))


def test_a_corrupt_image_fails_in_one_line(refused):
    line = one_line_error(refused["corrupt"], 2)
    assert "broken.png" in line and "not an image" in line


def test_a_missing_image_fails_in_one_line(refused):
    line = one_line_error(refused["missing"], 1)
    assert "nothere.png" in line and "no such file" in line


@pytest.mark.parametrize("args, said", USAGE_ERRORS)
def test_usage_errors(refused, args, said):
    line = one_line_error(refused[" ".join(args)], 2)
    assert said in line


def test_a_projector_for_another_model_is_refused(refused):
    line = one_line_error(refused["wrong projector"], 1)
    assert "mismatch between text model (n_embd = 576) and mmproj (n_embd = 2048)" in line


def test_run_image_goes_through_the_background_server(resident, smollm2, image_files, tmp_path):
    """With keep-alive on, `run --image` is answered by the resident server as chat's images are (the bytes
    and the projector's path sent over its socket): the same greedy answer as in-process, and a second
    question about the same image takes its KV from the slot, not from a new encoding."""
    from conftest import run_cli

    def ask_server(*extra: str, keep_alive: str = "5m", image: str = "red.png", mmproj: str = "mmproj-test.gguf"):
        return run_cli("run", str(smollm2), "--mmproj", str(image_files / mmproj), "--image", str(image_files / image),
                       *GREEDY, "--threads", "1", *extra, QUESTION, env={"LOCALRUN_KEEP_ALIVE": keep_alive})

    here = ask_server("--no-cache", keep_alive="0")
    first = ask_server("--no-cache")
    assert here.returncode == 0 and first.returncode == 0, first.stderr
    assert "started a localrun server in the background" in first.stderr
    server = resident()
    assert done(first.stdout)["tokens"] == done(here.stdout)["tokens"]
    assert done(first.stdout)["stats"]["prompt_tokens"] == done(here.stdout)["stats"]["prompt_tokens"]

    again = ask_server()  # the slot holds this image and question
    assert again.returncode == 0, again.stderr
    stats = done(again.stdout)["stats"]
    assert done(again.stdout)["tokens"] == done(here.stdout)["tokens"]
    assert stats["cached_tokens"] == stats["prompt_tokens"] - 1 and stats["load_s"] == 0
    assert resident() == server

    write_projector(tmp_path / "mmproj-other.gguf", seed=1)  # the model is loaded with the test projector
    other = run_cli("run", str(smollm2), "--mmproj", str(tmp_path / "mmproj-other.gguf"), "--image", str(image_files / "red.png"),
                    *GREEDY, "--threads", "1", QUESTION, env={"LOCALRUN_KEEP_ALIVE": "5m"})
    line = one_line_error(other, 2)
    assert "is loaded with the projector" in line and "mmproj-other.gguf" in line


def test_an_image_piped_on_stdin(smollm2, image_files, isolated_home):
    """`--image -` reads the image from stdin (the question then comes from the arguments): the same answer
    as from its file."""
    by_file, nothing = run_all(asking(smollm2, image_files, "red.png", extra=["--no-cache"]),
                               ["run", smollm2, "--mmproj", image_files / "mmproj-test.gguf", "--image", "-", *GREEDY, QUESTION],
                               home=isolated_home)
    by_file = answered(by_file)
    piped = subprocess.run([LOCALRUN, "run", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), "--image", "-",
                            *GREEDY, "--no-cache", QUESTION], input=(image_files / "red.png").read_bytes(), capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert done(piped.stdout.decode())["tokens"] == by_file["tokens"]
    assert one_line_error(nothing, 2) == "error: stdin: an empty file, not an image"  # stdin empty: nothing came


def test_a_session_keeps_its_images(resident, smollm2, image_files, tmp_path):
    """run --image --session: the session keeps the image with its message, so the next run of the session
    restores its KV (the image not encoded again) and asks about it; the same answers in-process and through
    the background server, which can continue each other's sessions."""
    from conftest import run_cli

    def turn(question: str, *extra: str, keep_alive: str, home=None) -> dict:
        env = {"LOCALRUN_KEEP_ALIVE": keep_alive} | ({"LOCALRUN_HOME": str(home)} if home else {})
        r = run_cli("run", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), *extra, "--session", "look",
                    *GREEDY, "--threads", "1", question, env=env)
        assert r.returncode == 0, r.stderr
        return done(r.stdout)

    answers = {}
    for keep_alive, home in (("0", tmp_path / "here"), ("5m", None)):
        first = turn("What is in this picture?", "--image", str(image_files / "red.png"), keep_alive=keep_alive, home=home)
        second = turn("Which colour is it?", keep_alive=keep_alive, home=home)
        assert second["stats"]["cached_tokens"] >= first["stats"]["prompt_tokens"] + 1  # the first turn, image and all
        answers[keep_alive] = (first["tokens"], second["tokens"])
    assert answers["0"] == answers["5m"]
    resident()
    # The server's session continued in this process, the image restored from the session's state
    third = turn("Is it round?", keep_alive="0")
    assert third["stats"]["cached_tokens"] > third["stats"]["prompt_tokens"] - 20


def test_prompt_lookup_takes_images(resident, smollm2, image_files):
    """--draft lookup drafts from the prompt's text (never an image's tokens): an image prompt is answered
    with it, the same in-process as in the background server's slots (lookup's context evaluates without flash
    attention, so its greedy tokens may part from plain decoding's where two are near tied)."""
    from conftest import run_cli

    got = []
    for keep_alive in ("0", "5m"):
        r = run_cli("run", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), "--image", str(image_files / "red.png"),
                    "--draft", "lookup", *GREEDY, "--threads", "1", "--no-cache", QUESTION, env={"LOCALRUN_KEEP_ALIVE": keep_alive})
        assert r.returncode == 0, r.stderr
        got.append(done(r.stdout))
    assert got[0]["tokens"] == got[1]["tokens"] and len(got[0]["tokens"]) == 10
    assert got[0]["stats"]["prompt_tokens"] == got[1]["stats"]["prompt_tokens"] > N_IMAGE
    resident()
