"""Images through llama.cpp's multimodal library (engine.vision), with real llama.cpp: SmolLM2-135M and a
projector with random weights made here (tests/projector.py). Its answers mean nothing; what these show is
that the path runs for real: the image tokens are those mtmd reports, the greedy answer is mtmd's own
(an oracle written against its C API), it depends on the image, and a known image is not encoded again."""

from __future__ import annotations

import ctypes
import io
import re

import numpy as np
import pytest

from localrun.cli.failures import message_for
from localrun.engine import Engine, LoadOptions, SamplingOptions, generate
from localrun.engine.vision import MARKER, BadImage, Image
from localrun.errors import EngineError, UsageError
from projector import IMAGE_SIZE, PATCH_SIZE, red_square, stripes, write_projector

QUESTION = f"<|im_start|>user\n{MARKER}What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingOptions(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return write_projector(tmp_path_factory.mktemp("vision") / "mmproj-test.gguf")


@pytest.fixture(scope="module")
def engine(smollm2, mmproj):
    eng = Engine(smollm2, LoadOptions(n_ctx=512))
    eng.load_projector(mmproj)
    yield eng
    eng.close()


def answer(engine, image_bytes: bytes, text: str = QUESTION) -> tuple[list[int], int]:
    """The greedy answer's tokens, and how many prompt tokens the KV held already."""
    tokens = engine.vision.tokenize(text, [Image(image_bytes, "test.png")])
    responses = list(generate(engine, tokens, GREEDY))
    return [t for r in responses for t in r.tokens], responses[-1].stats.cached_tokens


def mtmd_oracle(model_path, mmproj, image_bytes: bytes, text: str, n: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Greedy decoding written directly against llama.cpp's and mtmd's C API (mtmd_tokenize of the whole
    prompt, mtmd_helper_eval_chunks, argmax): the answer's tokens, and each chunk's (type, n_tokens)."""
    import llama_cpp as ll
    from llama_cpp import mtmd_cpp as m

    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(model_path).encode(), ll.llama_model_default_params())
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = 512
    ctx = ll.llama_init_from_model(model, cparams)
    params = m.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.warmup = False, False, False
    mctx = m.mtmd_init_from_file(str(mmproj).encode(), model, params)
    assert mctx
    buf = (ctypes.c_uint8 * len(image_bytes)).from_buffer_copy(image_bytes)
    bitmap = m.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(image_bytes), False)
    chunks = m.mtmd_input_chunks_init()
    inp = m.mtmd_input_text()
    inp.text = text.encode()
    inp.text_len = len(inp.text)
    inp.add_special, inp.parse_special = True, True
    assert m.mtmd_tokenize(mctx, chunks, ctypes.byref(inp), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
    layout = [(m.mtmd_input_chunk_get_type(c), m.mtmd_input_chunk_get_n_tokens(c))
              for c in (m.mtmd_input_chunks_get(chunks, i) for i in range(m.mtmd_input_chunks_size(chunks)))]
    n_past = ll.llama_pos(0)
    assert m.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    out = []
    for _ in range(n):
        tok = int(np.argmax(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))))
        if ll.llama_vocab_is_eog(vocab, tok):
            break
        out.append(tok)
        assert ll.llama_decode(ctx, ll.llama_batch_get_one((ll.llama_token * 1)(tok), 1)) == 0
    m.mtmd_input_chunks_free(chunks)
    m.mtmd_bitmap_free(bitmap)
    m.mtmd_free(mctx)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return out, layout


def test_image_tokens_are_what_mtmd_reports(engine, smollm2, mmproj):
    expected = (IMAGE_SIZE // PATCH_SIZE) ** 2  # LLaVA-1.5's projector: one token per patch of the resized image
    for image in (red_square(), stripes()):  # 40x30 and 64x64: both resized to the projector's 32x32
        tokens = engine.vision.tokenize(QUESTION, [Image(image, "x.png")])
        _, layout = mtmd_oracle(smollm2, mmproj, image, QUESTION, 0)
        assert [n for kind, n in layout if kind == 1] == [expected]
        assert sum(t < 0 for t in tokens) == expected
        assert len(tokens) == sum(n for _, n in layout)  # the text around it tokenized as mtmd tokenizes it


def test_greedy_answer_is_mtmds_own_token_for_token(engine, smollm2, mmproj):
    for image in (red_square(), stripes()):
        engine.reset()
        got, _ = answer(engine, image)
        want, _ = mtmd_oracle(smollm2, mmproj, image, QUESTION, GREEDY.max_tokens)
        assert got == want


def test_answer_depends_on_the_image_and_a_known_image_is_not_encoded_again(engine):
    engine.reset()
    red, _ = answer(engine, red_square())
    striped, _ = answer(engine, stripes())
    assert red != striped  # two images, two answers
    encoded = engine.vision.encoded
    again, cached = answer(engine, stripes())  # the KV holds this image and question: reused, not encoded
    assert again == striped
    assert engine.vision.encoded == encoded
    n_prompt = len(engine.vision.tokenize(QUESTION, [Image(stripes(), "x.png")]))
    assert cached == n_prompt - 1
    red_again, _ = answer(engine, red_square())  # the text before the image kept, the image encoded again
    assert red_again == red
    assert engine.vision.encoded == encoded + 1


def test_a_question_after_the_image_reuses_it(engine):
    engine.reset()
    answer(engine, red_square())
    encoded = engine.vision.encoded
    other = QUESTION.replace("What is in this picture?", "Which colour is it?")
    _, cached = answer(engine, red_square(), other)
    assert engine.vision.encoded == encoded
    assert cached >= 3 + (IMAGE_SIZE // PATCH_SIZE) ** 2  # the head of the prompt and the whole image


def test_two_images_in_one_prompt(engine):
    engine.reset()
    text = f"<|im_start|>user\n{MARKER}{MARKER}Compare them.<|im_end|>\n<|im_start|>assistant\n"
    tokens = engine.vision.tokenize(text, [Image(red_square(), "a.png"), Image(stripes(), "b.png")])
    assert sum(t < 0 for t in tokens) == 2 * (IMAGE_SIZE // PATCH_SIZE) ** 2
    swapped = engine.vision.tokenize(text, [Image(stripes(), "b.png"), Image(red_square(), "a.png")])
    assert tokens != swapped
    list(generate(engine, tokens, SamplingOptions(temperature=0, max_tokens=1)))
    assert engine.kv.tokens[0] == tokens  # the images and the text after them (the sampled token not evaluated)
    assert engine.vision.encoded >= 2


@pytest.mark.parametrize("data, said", [
    (b"", "an empty file"),
    (b"definitely not an image", "not an image llama.cpp can read"),
    (red_square()[:60], "not an image llama.cpp can read"),  # a truncated PNG
    (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(20), "WebP"),
])
def test_an_unreadable_image_is_refused_naming_it(engine, data, said):
    with pytest.raises(BadImage) as caught:
        engine.vision.tokenize(QUESTION, [Image(data, "holiday.png")])
    assert caught.value.name == "holiday.png"
    assert said in caught.value.reason
    assert "\n" not in caught.value.message
    assert caught.value.exit_code == 2


def test_other_formats_decode(engine):
    pil = pytest.importorskip("PIL.Image")
    picture = pil.open(io.BytesIO(stripes())).convert("RGB")
    answers = {}
    for fmt in ("PNG", "GIF", "BMP", "JPEG"):
        out = io.BytesIO()
        picture.save(out, fmt)
        engine.reset()
        answers[fmt], _ = answer(engine, out.getvalue())
    png, _ = answer(engine, stripes())
    assert answers["PNG"] == answers["BMP"] == answers["GIF"] == png  # lossless: the same pixels, the same answer
    assert answers["JPEG"]  # lossy: other pixels, some answer


def test_an_animated_gif_is_read_by_its_first_frame(engine):
    pil = pytest.importorskip("PIL.Image")
    frames = [pil.open(io.BytesIO(data)).convert("RGB") for data in (stripes(), red_square())]
    frames[1] = frames[1].resize(frames[0].size)
    animated, still = io.BytesIO(), io.BytesIO()
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], duration=100)
    frames[0].save(still, "GIF")
    engine.reset()
    first, _ = answer(engine, animated.getvalue())
    engine.reset()
    assert answer(engine, still.getvalue())[0] == first


def test_markers_must_match_the_images(engine):
    with pytest.raises(UsageError, match="2 image markers"):
        engine.vision.tokenize(QUESTION.replace("What", MARKER + "What"), [Image(red_square(), "a.png")])
    with pytest.raises(UsageError, match="ends with an image"):
        engine.vision.tokenize(f"Look: {MARKER}", [Image(red_square(), "a.png")])


def test_a_projector_for_another_width_is_refused_with_llama_cpps_reason(smollm2, tmp_path):
    wrong = write_projector(tmp_path / "mmproj-64.gguf", n_embd_text=64)
    with Engine(smollm2, LoadOptions(n_ctx=256)) as eng:
        with pytest.raises(EngineError) as caught:
            eng.load_projector(wrong)
        assert eng.vision is None
    assert "mmproj-64.gguf" in caught.value.message
    assert "mismatch between text model (n_embd = 576) and mmproj (n_embd = 64)" in caught.value.message  # llama.cpp's words
    assert "\n" not in caught.value.message


def test_a_file_that_is_no_projector_is_refused(smollm2, tmp_path):
    with Engine(smollm2, LoadOptions(n_ctx=256)) as eng:
        with pytest.raises(EngineError, match="could not load the projector"):
            eng.load_projector(smollm2)  # a GGUF, but a language model's


def test_the_request_path_answers_a_message_with_images(engine):
    """The one request path (runtime.generate, in this process): a message's images, the answer the
    engine gives that prompt, and a second request about the same image served from the KV."""
    from localrun.runtime.generate import generate as answer_request
    from localrun.runtime.loader import Loaded
    from localrun.runtime.request import Request, prompt_for

    loaded = Loaded(engine=engine, name="smollm2", sampling=GREEDY)
    request = Request(messages=[{"role": "user", "content": "What is in this picture?", "images": [Image(stripes(), "s.png")]}],
                      sampling=GREEDY)
    tokens = prompt_for(engine, request).tokens
    assert sum(t < 0 for t in tokens) == (IMAGE_SIZE // PATCH_SIZE) ** 2
    engine.reset()
    want = [t for r in generate(engine, tokens, GREEDY) for t in r.tokens]
    engine.reset()
    first = list(answer_request(loaded, request))
    assert [t for r in first for t in r.tokens] == want
    assert first[-1].stats.prompt_tokens == len(tokens) and first[-1].stats.cached_tokens == 0
    encoded = engine.vision.encoded
    second = list(answer_request(loaded, request))
    assert [t for r in second for t in r.tokens] == want
    assert second[-1].stats.cached_tokens == len(tokens) - 1
    assert engine.vision.encoded == encoded


def test_images_without_a_projector_are_refused_naming_them(smollm2):
    from localrun.runtime.request import Request, prompt_for

    request = Request(messages=[{"role": "user", "content": "What?", "images": [Image(red_square(), "cat.png")]}])
    with Engine(smollm2, LoadOptions(n_ctx=256)) as eng:
        with pytest.raises(UsageError) as caught:
            prompt_for(eng, request)
        assert re.match("cat.png: .* without an image projector: pass --mmproj", message_for(caught.value)[0])


GEMMA_QUESTION = f"<start_of_turn>user\n{MARKER}Describe this picture.<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def gemma3_mmproj(tmp_path_factory):
    from projector import write_gemma3_projector

    return write_gemma3_projector(tmp_path_factory.mktemp("vision") / "mmproj-gemma3.gguf", n_embd_text=640)


def test_a_gemma3_projector_wraps_its_images_and_decodes_them_non_causally(gemma, gemma3_mmproj):
    """Gemma 3's kind of projector: text tokens around each image (<start_of_image> ... <end_of_image>, which
    mtmd adds), its image decoded with non-causal attention; the greedy answer is mtmd's own."""
    with Engine(gemma, LoadOptions(n_ctx=512)) as eng:
        eng.load_projector(gemma3_mmproj)
        answers = []
        for image in (red_square(), stripes()):
            tokens = eng.vision.tokenize(GEMMA_QUESTION, [Image(image, "x.png")])
            want, layout = mtmd_oracle(gemma, gemma3_mmproj, image, GEMMA_QUESTION, GREEDY.max_tokens)
            assert [n for kind, n in layout if kind == 1] == [16]  # (32 / 4 / 2)^2: patches pooled 2x2
            assert len(tokens) == sum(n for _, n in layout)
            first = tokens.index(next(t for t in tokens if t < 0))
            assert [eng.token_bytes(t, special=True) for t in (tokens[first - 1], tokens[first + 16])] == [b"<start_of_image>", b"<end_of_image>"]  # mtmd's wrapping
            eng.reset()
            got, _ = answer(eng, image, GEMMA_QUESTION)
            assert got == want
            answers.append(got)
        assert answers[0] != answers[1]


def test_a_non_causal_image_larger_than_the_batch_is_refused_not_aborted(gemma, gemma3_mmproj):
    # llama.cpp asserts (and aborts the process) when non-causal attention spans more than one ubatch
    with Engine(gemma, LoadOptions(n_ctx=512, n_batch=8, n_ubatch=8)) as eng:
        eng.load_projector(gemma3_mmproj)
        tokens = eng.vision.tokenize(GEMMA_QUESTION, [Image(red_square(), "x.png")])
        with pytest.raises(UsageError) as caught:
            list(generate(eng, tokens, GREEDY))
        assert "images are 16 tokens, decoded in one batch: raise --batch to 16" in message_for(caught.value)[0]


@pytest.mark.parametrize("url, data, said", [
    ("data:image/png;base64,aGVsbG8=", b"hello", None),
    ("DATA:image/jpeg;BASE64,aGVs\nbG8=", b"hello", None),  # base64 wrapped in lines, as some clients send it
    ("data:;base64,aGVsbG8=", b"hello", None),
    ("https://example.com/cat.png", None, "a remote URL, which localrun does not fetch"),
    ("data:image/png,hello", None, "without ;base64"),
    ("data:image/png;base64,hello!", None, "not valid base64"),
    ("file:///etc/passwd", None, "not a data: URL"),
])
def test_images_sent_in_a_request_body(url, data, said):
    """runtime.images: what the HTTP dialects decode (OpenAI's and the Responses API's image URLs; Ollama's
    and Anthropic's base64 through the same reader), named as the request field they came in."""
    from localrun.runtime.images import image_from_url

    if said is None:
        image = image_from_url(url, "messages.0.content.1")
        assert (image.data, image.name) == (data, "messages.0.content.1")
        return
    with pytest.raises(BadImage) as caught:
        image_from_url(url, "messages.0.content.1")
    assert caught.value.name == "messages.0.content.1" and said in caught.value.reason
    assert caught.value.message.startswith("messages.0.content.1: ") and "\n" not in caught.value.message
