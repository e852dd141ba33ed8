"""What an error names, the command line words as flags: errors below it name settings (errors.Phrase,
SettingError, SettingsConflict: ctx, batch, beams), cli.failures names them --ctx, --batch, --beams, and a failure
in the background server reads the same as in-process (serve.dialects.native words it for the `run` that asked).
Real `localrun` processes, the real SmolLM2."""

from __future__ import annotations

LONG = "word " * 300  # over a context of 64 tokens


def test_settings_named_below_are_flags_on_the_command_line(cli, smollm2):
    # two settings that do not combine (engine.strategies), checked before anything answers
    r = cli("run", str(smollm2), "--beams", "2", "--draft", "lookup", "--keep-alive", "0", "Hi")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: --beams and --draft do not combine: pick one\n")
    # a value refused, its reason naming two more settings (runtime.options.check_slots), before the model loads
    r = cli("serve", str(smollm2), "--parallel", "8", "--batch", "4", "--port", "0")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("error: invalid --batch 4: each step decodes a token of every sequence, so it must hold at least"
                        " 8, one per slot (raise --batch or lower --parallel)\n")


def test_a_failure_reads_the_same_in_process_and_through_the_background_server(cli, smollm2, resident):
    args = ("run", str(smollm2), "--ctx", "64", "-n", "4", "--threads", "1", LONG)
    alone = cli(*args, "--keep-alive", "0")
    served = cli(*args)
    resident()  # (the second asked a background server: one answers)
    said = alone.stderr.strip().splitlines()
    assert alone.returncode == served.returncode == 1 and len(said) == 1
    assert said[0].startswith("error: the prompt is ") and said[0].endswith(
        ": raise --ctx (up to the model's 8192) or pass --truncate to keep its end")
    assert served.stderr.strip().splitlines()[-1] == said[0]
