"""JSON schema -> GBNF (engine/json_schema.py): every grammar made is one llama.cpp's parser accepts, text generated
under it with the real SmolLM2 validates against the schema (patterns included), and a schema that cannot become
a grammar is refused as a schema, naming the keyword and where it is."""

from __future__ import annotations

import json
import re

import pytest

from localrun.engine.json_schema import SchemaError
from localrun.engine.sampling import json_schema_grammar

VERSION = {"type": "object", "properties": {"version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"}},
           "required": ["version"]}

SCHEMAS = {
    "escaped dot": VERSION,
    "digit class and counts": {"type": "string", "pattern": "^\\d{3}-\\d{4}$"},
    "unanchored": {"type": "string", "pattern": "[A-Z]{2}\\d"},
    "groups and word class": {"type": "string", "pattern": "^(?:foo|bar)[\\w.-]+@[a-z]+\\.(com|org)$"},
    "negated class, hex range, escaped punctuation": {"type": "string", "pattern": '^[^\\s"]+\\s[\\x41-\\x5A\\-]+\\/\\\\$'},
    "nested object, enum, bounded integers, minItems": {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 300},
                                                         "minItems": 2, "maxItems": 4}}, "required": ["b"]},
            "c": {"enum": ["x", "y", 1, None]},
        },
        "required": ["a", "c"], "additionalProperties": False,
    },
    "dates, minItems": {"type": "array", "items": {"type": "string", "format": "date"}, "minItems": 1},
    "recursive $ref": {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "number"},
                                                                        "next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}}},
                       "$ref": "#/$defs/n"},
    "additionalProperties schema": {"type": "object", "additionalProperties": {"type": "boolean"}},
    "type list, maxLength": {"type": ["string", "null"], "maxLength": 5},
    "const with a quote and a backslash": {"type": "object", "properties": {"q": {"const": 'a\\"b'}}},
    "a range over the quote and the backslash": {"type": "string", "pattern": "^[ -~]+$"},
    "a class naming the quote, the backslash, a tab": {"type": "string", "pattern": '^[a-z\\-\\]"\\\\\\t]{2}$'},
}


@pytest.fixture(scope="module")
def vocab(smollm2):
    from localrun.engine import Engine, LoadOptions

    engine = Engine(smollm2, LoadOptions(n_ctx=256))
    yield engine
    engine.close()


@pytest.mark.parametrize("name", SCHEMAS)
def test_llama_cpp_accepts_the_grammar(vocab, name):
    from localrun.engine.llama import llama_cpp_module

    ll = llama_cpp_module()
    grammar = json_schema_grammar(SCHEMAS[name])
    handle = ll.llama_sampler_init_grammar(vocab.vocab, grammar.encode(), b"root")
    assert handle, f"llama.cpp refused:\n{grammar}"
    ll.llama_sampler_free(handle)


PROMPTED = [
    (VERSION, "What is the latest version of Python? Answer in JSON."),
    ({"type": "object", "properties": {"phone": {"type": "string", "pattern": "^\\d{3}-\\d{4}$"}}, "required": ["phone"]},
     "Give Ann's phone number as JSON."),
    ({"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
                                       "tags": {"type": "array", "items": {"enum": ["work", "home"]}, "minItems": 2, "maxItems": 3}},
      "required": ["email", "tags"]},
     "Give Ann's email address and two tags as JSON."),
    ({"type": "object", "properties": {"quote": {"type": "string", "pattern": "^[ -~]{1,30}$"}}, "required": ["quote"]},
     'Quote a line of C code with "double quotes" and a backslash as JSON.'),
    ({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}\\d{2}[^\\s\"]{0,3}$"},
                                       "ok": {"type": "boolean"}}, "required": ["id", "ok"]},
     "Make an ID as JSON."),
]


@pytest.mark.parametrize("schema, prompt", PROMPTED, ids=[s[1][:24] for s in PROMPTED])
@pytest.mark.parametrize("temperature, seed", [("0", "1"), ("0.8", "7")])
def test_generated_text_matches_the_schema(smollm2, cli, tmp_path, schema, prompt, temperature, seed):
    import jsonschema

    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    r = cli("run", str(smollm2), "-t", temperature, "--seed", seed, "-n", "120", "--ctx", "512", "--json-schema", str(f), prompt)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), schema)  # validates each pattern with Python's re.search


def test_the_issue_pattern_is_not_refused_as_gbnf(smollm2, cli, tmp_path):
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(VERSION))
    r = cli("run", str(smollm2), "-t", "0", "-n", "40", "--ctx", "512", "--json-schema", str(f), "Python's version as JSON")
    assert r.returncode == 0 and "GBNF" not in r.stderr, r.stderr
    assert re.fullmatch(r"[0-9]+\.[0-9]+", json.loads(r.stdout)["version"])


@pytest.mark.parametrize("pattern, reason", [
    ("^(?=a)[0-9]+$", "lookarounds"),
    ("^\\b[0-9]+$", "word boundaries"),
    ("^(a)\\1$", "backreferences"),
    ("^[0-9+$", "character class is not closed"),
    ("^(ab$", "parentheses are unbalanced"),
    ("^a|b$", "group it as '^(a|b)$'"),
])
def test_a_pattern_without_a_grammar_is_refused_as_a_schema_error(pattern, reason):
    schema = {"type": "object", "properties": {"version": {"type": "string", "pattern": pattern}}}
    with pytest.raises(SchemaError) as exc:
        json_schema_grammar(schema)
    assert exc.value.where == "properties.version" and exc.value.keyword == "pattern"
    assert exc.value.message.startswith("the JSON schema's pattern at 'properties.version' cannot be turned into a grammar: ")
    assert reason in exc.value.message and json.dumps(pattern) in exc.value.message and "GBNF" not in exc.value.message


def test_schema_errors_name_their_place():
    with pytest.raises(SchemaError, match=r"the JSON schema's \$ref at 'properties.a' .*#/\$defs/missing does not resolve"):
        json_schema_grammar({"properties": {"a": {"$ref": "#/$defs/missing"}}})
    with pytest.raises(SchemaError, match=r"the JSON schema's minItems at 'items' .*non-negative integer"):
        json_schema_grammar({"type": "array", "items": {"type": "array", "minItems": -1}})
    with pytest.raises(SchemaError, match=r"the JSON schema's type cannot .*unknown type 'text'"):
        json_schema_grammar({"type": "text"})


def test_cli_refuses_a_bad_pattern_in_one_line(smollm2, cli, tmp_path):
    f = tmp_path / "schema.json"
    f.write_text(json.dumps({"type": "object", "properties": {"version": {"type": "string", "pattern": "^(?=x)[0-9]+$"}}}))
    r = cli("run", str(smollm2), "-n", "5", "--json-schema", str(f), "hi")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: the JSON schema's pattern at 'properties.version' cannot be turned into a grammar: "
        "lookarounds, named groups and inline flags ('(?') are not supported (in \"^(?=x)[0-9]+$\", as JSON writes it)"
    ]


def test_a_grammar_checks_the_chains_pick_and_picks_as_if_applied_first(smollm2):
    """The grammar is its own sampler beside the chain (llama.cpp's common sampler): the chain's pick is checked
    against it alone, and only a refused pick has the grammar applied to every token. Greedy, that is the token
    the grammar applied first gives, step after step (here against a chain with the grammar in it, the whole
    vocabulary filtered each step); the prompt makes the unconstrained pick text the grammar refuses."""
    from localrun.engine import Engine, LoadOptions, SamplingOptions
    from localrun.engine.llama import llama_cpp_module
    from localrun.engine.model import Batch
    from localrun.engine.sampling import Sampler

    ll = llama_cpp_module()
    grammar = json_schema_grammar(VERSION)
    engine = Engine(str(smollm2), LoadOptions(n_ctx=512, n_threads=1))
    try:
        reference = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        ll.llama_sampler_chain_add(reference, ll.llama_sampler_init_grammar(engine.vocab, grammar.encode(), b"root"))
        ll.llama_sampler_chain_add(reference, ll.llama_sampler_init_greedy())
        sampler = Sampler(engine, SamplingOptions(temperature=0, json_schema=VERSION))
        prompt = engine.tokenize("Tell me a story about a dragon.")
        batch, ours, refused = Batch(len(prompt) + 64), [], 0
        batch.add_span(prompt, 0, 0)
        batch.want_output(batch.n - 1)
        for step in range(40):
            engine.decode(batch)
            free = int(engine.logits(batch.n - 1).argmax())
            tok = sampler.sample(engine.ctx, step, batch.n - 1)
            assert tok == ll.llama_sampler_sample(reference, engine.ctx, batch.n - 1), (step, ours)
            refused += tok != free
            ours.append(tok)
            if engine.is_eog(tok):
                break
            batch.clear()
            batch.add(tok, len(prompt) + step, 0, True)
        ll.llama_sampler_free(reference)
        sampler.close()
        text = engine.detokenize([t for t in ours if not engine.is_eog(t)])
    finally:
        engine.close()
    assert refused > 0, ours  # some picks were refused and made again under the grammar
    assert re.fullmatch(r"[0-9]+\.[0-9]+", json.loads(text)["version"]), text
