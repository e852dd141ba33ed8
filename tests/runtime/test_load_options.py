"""The one load-options type (runtime.options.LoadSpec) and what each front end builds of it, tested alone and
fast (no model): the one table of the load names a request may use, every load flag the command line shares
is a LoadSpec field with LoadSpec's default, and a bench row's settings are a LoadSpec."""

from __future__ import annotations

from dataclasses import fields

from localrun.runtime.options import LOAD_OPTIONS, OLLAMA_LOAD, LoadSpec
from localrun.serve import checks, errors


def test_the_load_names_a_request_may_use_are_one_table_of_loadspec_fields():
    assert set(LOAD_OPTIONS.values()) <= {f.name for f in fields(LoadSpec)}
    assert OLLAMA_LOAD.items() <= LOAD_OPTIONS.items()
    # the error table and the dialects read the same table (each wrote it out once)
    assert errors.LOAD_SETTINGS == frozenset(LOAD_OPTIONS.values())
    assert checks.load_options({name: 2 for name in ("num_ctx", "num_thread", "num_batch", "num_parallel")}) == {
        "ctx": 2, "threads": 2, "batch": 2, "parallel": 2}
    assert checks.load_options({"num_gpu": 0, "kv_type": "q8_0", "flash_attn": True}) == {
        "gpu_layers": "0", "kv_type": "q8_0", "flash_attn": True}
    assert {checks.options_name(f"load.{setting}") for setting in LOAD_OPTIONS.values()} == {
        f"options.{name}" for name in LOAD_OPTIONS}


def test_every_load_flag_the_command_line_shares_is_a_loadspec_field_with_its_default():
    """cli.main._load_spec takes the flags by LoadSpec's field names: a new flag named otherwise, or defaulting
    otherwise, would be dropped or would load another way than the library's LoadSpec() (--help would lie)."""
    import inspect

    from localrun.cli.options import _decoding, _generation

    spec = {f.name: f.default for f in fields(LoadSpec)}
    for template in (_generation, _decoding):
        for name, param in inspect.signature(template).parameters.items():
            if name == "source":  # where the model comes from, not how it loads
                continue
            assert name in spec, f"--{name.replace('_', '-')} is no LoadSpec field"
            assert param.default == spec[name] or (name == "lora" and param.default is None), name


def test_a_bench_rows_settings_are_a_loadspec():
    """bench loads each row as run does (LoadSpec.engine_options), with --flash-attn's words read once."""
    from localrun.runtime.reports import bench

    plan = bench.make_plan(["m"], threads="2", ctx="600", batch="64", kv_type="q8_0", gpu_layers="0", flash_attn="auto,on",
                           decode="plain,lookup")
    specs = [s.spec for s in plan.settings]
    assert all(isinstance(spec, LoadSpec) for spec in specs)
    assert specs[0] == LoadSpec(threads=2, ctx=600, batch=64, kv_type="q8_0", gpu_layers="0")
    assert [(s.flash_attn, s.spec.flash_attn, s.decode) for s in plan.settings] == [
        ("auto", None, "plain"), ("auto", None, "lookup"), ("on", True, "plain"), ("on", True, "lookup")]
    assert list(bench.FLASH_ATTN) == bench.RESULT_SCHEMA["items"]["properties"]["settings"]["properties"]["flash_attn"]["enum"]
    assert plan.settings[0].as_dict(600) == {"threads": 2, "ctx": 600, "batch": 64, "kv_type": "q8_0", "gpu_layers": 0,
                                             "flash_attn": "auto", "decode": "plain"}
