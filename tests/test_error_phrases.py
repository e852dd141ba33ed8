"""errors.Phrase and the typed errors made of it: a sentence names settings, each edge names them its way (the
command line's flags: cli.failures; a dialect's fields: serve.errors), and what is put in as a value is never
read as a setting."""

from __future__ import annotations

from localrun.cli.failures import message_for
from localrun.errors import EXIT_USAGE, ContextOverflow, Phrase, SettingError, SettingsConflict, UsageError


def test_a_phrase_names_its_settings_and_puts_values_in_as_they_are():
    said = Phrase("{path} ({why}): try a smaller {ctx} or {kv_type}", path="/m/{x}.gguf", why="{bad}")
    assert said.settings == ("ctx", "kv_type")
    assert said.worded(str.upper) == "/m/{x}.gguf ({bad}): try a smaller CTX or KV_TYPE"  # braces in a value stay
    assert str(said) == "/m/{x}.gguf ({bad}): try a smaller ctx or kv_type"


def test_each_typed_error_is_worded_by_the_edge():
    nested = SettingError("parallel", 8, Phrase("raise {batch}"))
    assert (nested.message, nested.settings) == ("invalid parallel 8: raise batch", ("parallel", "batch"))
    assert message_for(nested) == ("invalid --parallel 8: raise --batch", EXIT_USAGE)
    three = SettingsConflict(("beams", "grammar", "json_schema"), Phrase("drop {beams}"))
    assert message_for(three)[0] == "--beams, --grammar and --json-schema do not combine: drop --beams"
    assert three.worded(lambda s: f"options.{s}") == (
        "options.beams, options.grammar and options.json_schema do not combine: drop options.beams")
    plain = UsageError("a sentence with {braces} and --no setting")  # a plain message is taken as written
    assert plain.settings == () and message_for(plain)[0] == "a sentence with {braces} and --no setting"
    over = ContextOverflow(Phrase("{n} tokens: raise {ctx}", n=9), n_prompt=9, n_ctx=4)
    assert (over.message, over.n_prompt, message_for(over)[0]) == ("9 tokens: raise ctx", 9, "9 tokens: raise --ctx")
