"""Images over HTTP (issue #34): OpenAI image_url parts, Ollama `images`, Anthropic image blocks and the
Responses API's input_image, on `localrun serve MODEL --mmproj FILE` with SmolLM2-135M and a projector with
random weights made here (tests/projector.py). Its answers mean nothing; what these show is that every
entry point reads the same image into the same prompt: the same greedy answer as `run --image`, token for
token, the image tokens mtmd's count, a known image's KV reused from a slot rather than encoded again, image
prompts batched beside text ones, and a bad image refused in the dialect's own error shape, naming it."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import pytest

from conftest import last_json, start_server
from projector import IMAGE_SIZE, PATCH_SIZE, png_bytes, red_square, stripes

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

N_IMAGE = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the projector's image tokens, as mtmd reports them (tests/engine/test_vision.py)
QUESTION = "Look at this picture carefully and describe what you see in it"
N = 10  # tokens answered


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server(smollm2, image_files, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--mmproj", str(image_files / "mmproj-test.gguf"), "--ctx", "512",
                       "--parallel", "2") as srv:
        yield srv


@pytest.fixture(scope="module")
def by_run(smollm2, image_files):
    """`localrun run --image` (in-process, no server): the greedy answer's text, tokens and prompt length per image."""
    from conftest import run_cli

    answers = {}
    for name in ("red.png", "stripes.png"):
        r = run_cli("run", str(smollm2), "--mmproj", str(image_files / "mmproj-test.gguf"), "--image", str(image_files / name), "--temperature", "0",
                    "--max-tokens", str(N), "--ctx", "512", "--threads", "1", "--json", "--no-cache", QUESTION)
        assert r.returncode == 0, r.stderr
        done = last_json(r.stdout)
        answers[name] = done
    assert answers["red.png"]["text"] != answers["stripes.png"]["text"]  # two images, two answers
    return answers


def chat(server, model, image: bytes, question: str = QUESTION, **more):
    client = server.client("none", timeout=300)
    return client.chat.completions.create(model=model.name, temperature=0, max_tokens=N, **more, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": question}]}])


def test_every_entry_point_gives_runs_answer_token_for_token(server, smollm2, by_run):
    for name, image in (("red.png", red_square()), ("stripes.png", stripes())):
        want = by_run[name]
        assert want["stats"]["prompt_tokens"] > N_IMAGE and len(want["tokens"]) == N

        openai_answer = chat(server, smollm2, image, logprobs=True, top_logprobs=0)
        assert openai_answer.choices[0].message.content == want["text"]
        assert openai_answer.usage.prompt_tokens == want["stats"]["prompt_tokens"]
        assert openai_answer.usage.completion_tokens == len(want["tokens"])
        assert "".join(t.token for t in openai_answer.choices[0].logprobs.content) == want["text"]

        c = ollama.Client(host=server.url)
        options = {"temperature": 0, "num_predict": N}
        by_chat = c.chat(model=smollm2.name, messages=[{"role": "user", "content": QUESTION, "images": [image]}], options=options)
        assert by_chat.message.content == want["text"]
        assert (by_chat.prompt_eval_count, by_chat.eval_count) == (want["stats"]["prompt_tokens"], len(want["tokens"]))
        by_generate = c.generate(model=smollm2.name, prompt=QUESTION, images=[image], options=options)
        assert by_generate.response == want["text"]
        assert by_generate.prompt_eval_count == want["stats"]["prompt_tokens"]

        claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=300)
        message = claude.messages.create(model=smollm2.name, max_tokens=N, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}},
            {"type": "text", "text": QUESTION}]}])
        assert message.content[0].text == want["text"]
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens == want["stats"]["prompt_tokens"]
        assert message.usage.output_tokens == len(want["tokens"])

        client = server.client("none", timeout=300)
        response = client.responses.create(model=smollm2.name, temperature=0, max_output_tokens=N, store=False, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(image)}, {"type": "input_text", "text": QUESTION}]}])
        assert response.output_text == want["text"]
        assert (response.usage.input_tokens, response.usage.output_tokens) == (want["stats"]["prompt_tokens"], len(want["tokens"]))


def test_a_known_image_is_not_encoded_again(server, smollm2, by_run):
    first = chat(server, smollm2, stripes())
    again = chat(server, smollm2, stripes())
    assert again.choices[0].message.content == first.choices[0].message.content == by_run["stripes.png"]["text"]
    # the whole prompt was in a slot's KV (the image too): only its last token evaluated
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # another question about it: its image (and the text before it) from the KV, only the new words evaluated
    other = chat(server, smollm2, stripes(), question="What colours are in this image?")
    # an image never sent before shares only the text before it (the system prompt, the turn's start)
    green = chat(server, smollm2, png_bytes(24, 24, lambda x, y: (0, 200, 0)))
    before = green.usage.prompt_tokens_details.cached_tokens
    assert 0 < before < green.usage.prompt_tokens - N_IMAGE, green.usage
    assert other.usage.prompt_tokens_details.cached_tokens >= before + N_IMAGE, other.usage


def test_image_prompts_are_answered_beside_text_ones(server, smollm2, by_run):
    """Two image requests and a text one at once, on two slots: each answer as it is alone."""
    client = server.client("none", timeout=300)
    text_alone = client.chat.completions.create(model=smollm2.name, temperature=0, max_tokens=N,
                                                messages=[{"role": "user", "content": "Name three rivers of Europe."}])
    results: dict = {}

    def ask(key, fn):
        results[key] = fn()

    threads = [threading.Thread(target=ask, args=(name, lambda image=image: chat(server, smollm2, image, question=QUESTION + " now")))
               for name, image in (("red", red_square()), ("stripes", stripes()))]
    threads.append(threading.Thread(target=ask, args=("text", lambda: client.chat.completions.create(
        model=smollm2.name, temperature=0, max_tokens=N, messages=[{"role": "user", "content": "Name three rivers of Europe."}]))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results["text"].choices[0].message.content == text_alone.choices[0].message.content
    alone = {name: chat(server, smollm2, image, question=QUESTION + " now").choices[0].message.content
             for name, image in (("red", red_square()), ("stripes", stripes()))}
    assert {name: results[name].choices[0].message.content for name in alone} == alone
    assert alone["red"] != alone["stripes"]


def test_webp_is_read_as_its_pixels(server, smollm2, by_run):
    pil = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    pil.open(io.BytesIO(red_square())).save(out, "WEBP", lossless=True)
    client = server.client("none", timeout=300)
    answer = client.chat.completions.create(model=smollm2.name, temperature=0, max_tokens=N, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(out.getvalue(), "webp")}}, {"type": "text", "text": QUESTION}]}])
    assert answer.choices[0].message.content == by_run["red.png"]["text"]  # lossless: the same pixels, the same answer


BROKEN = red_square()[:50]


@pytest.mark.parametrize("url, param, said", [
    (data_url(BROKEN), "messages.0.content.1", "not an image llama.cpp can read"),
    ("https://example.com/cat.png", "messages.0.content.1", "a remote URL, which localrun does not fetch"),
    ("data:image/png;base64,@@not-base64@@", "messages.0.content.1", "not valid base64"),
    ("data:image/png,rawbytes", "messages.0.content.1", "without ;base64"),
])
def test_openai_bad_images_are_400_naming_the_part(server, smollm2, url, param, said):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={"model": smollm2.name, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param + ": ") and said in error["message"] and "\n" not in error["message"]


def test_every_dialect_refuses_a_corrupt_image_in_its_own_shape(server, smollm2):
    broken = base64.b64encode(BROKEN).decode()
    c = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as failed:
        c.chat(model=smollm2.name, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
                                             {"role": "user", "content": "Look", "images": [red_square(), BROKEN]}])
    assert failed.value.status_code == 400
    assert failed.value.error.startswith("messages.2.images.1: not an image llama.cpp can read")
    raw = httpx.post(server.url + "/api/generate", timeout=120, json={"model": smollm2.name, "prompt": "Look", "images": [broken], "stream": False})
    assert raw.status_code == 400 and set(raw.json()) == {"error"} and raw.json()["error"].startswith("images.0: not an image")

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=smollm2.name, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "Look"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": broken}}]}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert err.value.body["error"]["message"].startswith("messages.0.content.1: not an image llama.cpp can read")
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=smollm2.name, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}, {"type": "text", "text": "Look"}]}])
    assert "messages.0.content.0: a remote URL, which localrun does not fetch" in err.value.body["error"]["message"]

    client = server.client("none")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=smollm2.name, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": data_url(BROKEN)}]}])
    assert err.value.body["param"] == "input.0.content.1"
    assert err.value.body["message"].startswith("input.0.content.1: not an image llama.cpp can read")
    assert chat(server, smollm2, red_square()).choices[0].message.content  # the server goes on


def test_a_model_without_a_projector_refuses_images_naming_them(server, tiny_smollm2):
    """A model the server loads on request, with no projector named for it nor beside it (the tiny model of
    tests/tinymodel.py: another file, loaded in a fraction of SmolLM2's time)."""
    tools_model = tiny_smollm2
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={"model": str(tools_model), "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(red_square())}}, {"type": "text", "text": "Look"}]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages.0.content.0"
    assert error["message"] == (f"messages.0.content.0: the model {tools_model.name} has no image projector: start the server with"
                                " --mmproj FILE for it, or put its mmproj-*.gguf beside the model file")


def test_serve_mmproj_needs_its_model(cli, image_files):
    r = cli("serve", "--mmproj", str(image_files / "mmproj-test.gguf"), "--port", "0")
    assert r.returncode == 2 and "--mmproj needs the MODEL" in r.stderr
    r = cli("serve", "smollm2", "--mmproj", str(image_files / "none.gguf"), "--port", "0")
    assert r.returncode == 2 and "invalid --mmproj" in r.stderr


def test_an_image_prompt_is_restored_from_disk_after_a_restart(smollm2, image_files, tmp_path):
    """The prefix cache on disk keeps an image prompt's KV (its image tokens keyed by the image's and the
    projector's hashes): after a restart the same question about the same image evaluates only its last
    token, encodes nothing, and answers as the prompt evaluated from scratch did. (The first server, in an empty
    home, is that reference: a third one in another empty home asked the same and proved nothing more.)"""
    args = ("--mmproj", str(image_files / "mmproj-test.gguf"), "--ctx", "512", "--parallel", "1")
    question = QUESTION + ": the colours, the shapes, the light, and anything else about it that stands out"  # 64+ tokens: cached
    with start_server(smollm2, tmp_path / "home", *args) as first:  # nothing stored yet
        cold = chat(first, smollm2, stripes(), question=question)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    with start_server(smollm2, tmp_path / "home", *args) as again:
        warm = chat(again, smollm2, stripes(), question=question)
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens >= 64 and cold.usage.prompt_tokens > N_IMAGE
    assert warm.usage.prompt_tokens_details.cached_tokens == warm.usage.prompt_tokens - 1, warm.usage
    assert warm.choices[0].message.content == cold.choices[0].message.content
