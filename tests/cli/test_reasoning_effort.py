"""`run --reasoning-effort` reaches the model's template (as gpt-oss's reads it), in this process and through the
background server alike; a level the flag does not know is a usage error naming the ones it does."""

from __future__ import annotations

import pytest

from conftest import last_json

pytestmark = pytest.mark.slow

# A template that writes what the effort asks for, as gpt-oss's writes "Reasoning: high" into its system message.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if reasoning_effort is defined and reasoning_effort == 'high' %}<|im_start|>system\n"
            "{{ 'Think long and hard about every single word before you answer. ' * 8 }}<|im_end|>\n{% endif %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_the_effort_reaches_the_template_in_process_and_through_the_server(smollm2, cli, tmp_path):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f'FROM {smollm2}\nTEMPLATE """{TEMPLATE}"""\n')
    assert cli("create", "effort", "-f", str(modelfile)).returncode == 0

    def prompt_tokens(*flags: str) -> int:
        r = cli("run", "effort", "-n", "2", "-t", "0", "--threads", "1", "--json", *flags, "Hi")
        assert r.returncode == 0, r.stderr
        return last_json(r.stdout)["stats"]["prompt_tokens"]

    plain = prompt_tokens("--keep-alive", "0")
    assert prompt_tokens("--keep-alive", "0", "--reasoning-effort", "low") == plain
    high = prompt_tokens("--keep-alive", "0", "--reasoning-effort", "high")
    assert high > plain + 50
    assert prompt_tokens("--reasoning-effort", "high") == high  # the background server renders it the same
    cli("stop", "--server")
    wrong = cli("run", "effort", "--keep-alive", "0", "--reasoning-effort", "extreme", "Hi")
    assert wrong.returncode == 2 and "use minimal, low, medium, high or xhigh" in wrong.stderr and "Traceback" not in wrong.stderr
