"""Ollama's Modelfile as localrun reads it (hub.modelfile), and what `create` makes of each instruction
(runtime.models.create): what it honours lands in the registry's defaults, what it cannot is one line naming it."""

from __future__ import annotations

import pytest

from localrun.errors import LocalrunError, UsageError
from localrun.hub import defaults_for, list_local, resolve_local
from localrun.hub.modelfile import ModelfileError, parse_modelfile
from localrun.runtime.models.create import copy_model, create_model

FULL = '''# comment lines and blank lines are skipped

FROM ./model.gguf
parameter temperature 0.3
PARAMETER num_predict 42
PARAMETER stop "<|im_end|>"
PARAMETER stop "### Human:"
PARAMETER num_ctx 2048
SYSTEM """You are a pirate.
Answer like one."""
MESSAGE user Who are you?
MESSAGE assistant "Arr, a pirate!"
LICENSE MIT
'''


def test_every_instruction_is_read_with_its_value():
    mf = parse_modelfile(FULL)
    assert mf.base == "./model.gguf"
    assert mf.parameters == [("temperature", "0.3"), ("num_predict", "42"), ("stop", "<|im_end|>"), ("stop", "### Human:"),
                             ("num_ctx", "2048")]
    assert mf.system == "You are a pirate.\nAnswer like one."
    assert mf.messages == [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "Arr, a pirate!"}]
    assert mf.license == "MIT" and mf.template is None and mf.adapters == []


@pytest.mark.parametrize("text, read", [
    ("FROM\tx\nPARAMETER\ttemperature\t0.5\n", {"base": "x", "parameters": [("temperature", "0.5")]}),  # tabs separate
    ("\ufeffFROM x\n", {"base": "x"}),  # a byte-order mark (Windows editors)
    # A "quoted" value over several lines: as Ollama writes one without quotes in it (show --modelfile)
    ('FROM x\nSYSTEM "You are a helpful assistant.\nAnswer briefly."\n', {"system": "You are a helpful assistant.\nAnswer briefly."}),
    ('FROM x\nMESSAGE user """first line\nsecond line"""\nMESSAGE assistant "ok"\n',
     {"messages": [{"role": "user", "content": "first line\nsecond line"}, {"role": "assistant", "content": "ok"}]}),
    ('FROM x\nPARAMETER stop """\n\n"""\n', {"parameters": [("stop", "\n\n")]}),
    ('FROM x\nSYSTEM "Files live in C:\\temp\\new"\n', {"system": "Files live in C:\\temp\\new"}),  # quotes only stripped
    ('FROM x\nPARAMETER stop "\\n\\n"\n', {"parameters": [("stop", "\n\n")]}),  # as show --modelfile writes one
    ("FROM x\nLICENSE MIT\nLICENSE \"\"\"Apache-2.0\nand more\"\"\"\n", {"license": "MIT\n\nApache-2.0\nand more"}),  # each kept
])
def test_what_ollamas_parser_reads_is_read_alike(text, read):
    mf = parse_modelfile(text)
    assert {key: getattr(mf, key) for key in read} == read


@pytest.mark.parametrize("text, line, words", [
    ("FROM x\nSYSTEM \"\"\"never closed\n", 2, 'never closed'),
    ("FROM x\nBOGUS thing\n", 2, "unknown instruction 'BOGUS'"),
    ("FROM x\n\nPARAMETER temperature\n", 3, "PARAMETER temperature needs a value"),
    ("FROM x\nMESSAGE tool hello\n", 2, "MESSAGE role 'tool'"),
    ("FROM\n", 1, "FROM needs a value"),
    ('FROM x\nSYSTEM "never closed\n', 2, 'the " opened here is never closed'),
    ("FROM ./model.gguf   # the file\n", 1, "a # starts a comment only at the start of a line"),
])
def test_a_malformed_modelfile_names_its_line(text, line, words):
    with pytest.raises(ModelfileError) as caught:
        parse_modelfile(text)
    assert caught.value.line == line and words in caught.value.message, caught.value.message


@pytest.fixture
def model_dir(tmp_path, smollm2):
    (tmp_path / "model.gguf").symlink_to(smollm2)
    return tmp_path


def test_create_keeps_the_modelfiles_defaults_over_the_files_own(model_dir):
    notes = []
    made = create_model("Pirate:latest", parse_modelfile(FULL + "PARAMETER num_gpu 0\nPARAMETER tfs_z 1\nPARAMETER draft_num_predict 8\n"), base_dir=model_dir,
                        on_notice=notes.append)
    assert made.name == "Pirate" and made.source == "created" and made.files == ((model_dir / "model.gguf").resolve(),)
    assert len(made.sha256[0]) == 64  # a path is hashed at create: damage is caught on use, as for a pull
    brought = defaults_for("pirate:latest")  # Ollama's tag, any case
    assert brought.made and brought.context == 2048 and brought.system.startswith("You are a pirate.")
    assert brought.sampling == {"temperature": 0.3, "max_tokens": 42, "stop": ["<|im_end|>", "### Human:"]}
    assert brought.messages[1] == {"role": "assistant", "content": "Arr, a pirate!"}
    assert any("num_gpu" in n and "--gpu-layers" in n for n in notes) and any("tfs_z" in n for n in notes)
    assert any("draft_num_predict" in n and "--draft-max" in n for n in notes)
    assert resolve_local("pirate").name == "Pirate" and [m.name for m in list_local()] == ["Pirate"]

    # A model made from a made model starts from its defaults; cp copies them under another name.
    create_model("pirate2", parse_modelfile("FROM pirate\nPARAMETER temperature 0\n"))
    second = defaults_for("pirate2")
    assert second.sampling["temperature"] == 0.0 and second.system == brought.system and second.context == 2048
    copy_model("pirate2", "pirate3")
    assert defaults_for("pirate3") == second
    assert {m.name for m in list_local()} == {"Pirate", "pirate2", "pirate3"}

    # The same name again replaces the model, as Ollama's create does.
    create_model("pirate", parse_modelfile(f"FROM {model_dir / 'model.gguf'}\n"))
    assert defaults_for("pirate").system is None and len(list_local()) == 3


@pytest.mark.parametrize("text, words", [
    ("PARAMETER temperature 0\n", "no FROM line"),
    ("FROM ./model.gguf\nPARAMETER temperature hot\n", "invalid PARAMETER temperature 'hot'"),
    ("FROM ./model.gguf\nPARAMETER num_predict -5\n", "invalid PARAMETER num_predict '-5'"),
    ("FROM ./model.gguf\nPARAMETER num_ctx lots\n", "invalid PARAMETER num_ctx 'lots'"),
    ("FROM ./model.gguf\nPARAMETER warmth 3\n", "unknown PARAMETER 'warmth'"),
    ("FROM ./model.gguf\nADAPTER ./lora.gguf\n", "lora.gguf: no such file"),
    ("FROM ./model.gguf\nTEMPLATE {% for m in messages %}\n", "TEMPLATE is not a valid Jinja chat template"),
    ("FROM nosuchmodel\n", "unknown model 'nosuchmodel'"),
])
def test_what_create_cannot_make_is_one_line_and_nothing_is_registered(model_dir, text, words):
    with pytest.raises(LocalrunError) as caught:  # a usage error, or the model FROM names not found
        create_model("mine", parse_modelfile(text), base_dir=model_dir)
    assert words in caught.value.message and "\n" not in caught.value.message, caught.value.message
    assert list_local() == []


@pytest.mark.parametrize("name, words", [
    ("smollm2", "is a catalogue alias"), ("me/mine", "cannot name a model"), ("mine:v2", "no tag but :latest"),
])
def test_a_name_that_would_read_as_something_else_is_refused(model_dir, name, words):
    with pytest.raises(UsageError) as caught:
        create_model(name, parse_modelfile("FROM ./model.gguf\n"), base_dir=model_dir)
    assert words in caught.value.message


def test_an_ollama_go_template_is_not_used_and_said_so(model_dir):
    notes = []
    create_model("mine", parse_modelfile('FROM ./model.gguf\nTEMPLATE """{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}"""\n'),
                 base_dir=model_dir, on_notice=notes.append)
    assert defaults_for("mine").template is None
    assert notes == ["ignoring TEMPLATE: it is an Ollama (Go) template, which localrun cannot render; the model's own chat "
                     "template (Jinja, from its GGUF) is used"]
    jinja = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    create_model("mine", parse_modelfile(f'FROM ./model.gguf\nTEMPLATE """{jinja}"""\n'), base_dir=model_dir)
    assert defaults_for("mine").template == jinja
