"""A Modelfile TEMPLATE that is not Jinja: `create` says so in one line naming the template's line and the problem,
exits 2, and makes no model; a template with loop controls (Command R7B's {% break %}) is taken."""

from __future__ import annotations


def test_a_template_that_does_not_compile_is_one_line_naming_its_line(cli, tmp_path, smollm2):
    bad = tmp_path / "Bad"
    bad.write_text(f'FROM {smollm2}\nTEMPLATE """{{% for m in messages %}}\n{{{{ m.content }}\n{{% endfor %}}"""\n')
    made = cli("create", "bad", "-f", str(bad))
    assert made.returncode == 2 and "Traceback" not in made.stderr
    [line] = made.stderr.strip().splitlines()
    assert "not a valid Jinja chat template" in line and "line 2" in line, line
    assert cli("show", "bad").returncode != 0  # no model was made
    good = tmp_path / "Good"
    good.write_text(f'FROM {smollm2}\nTEMPLATE """{{% for m in messages %}}{{% if loop.index > 9 %}}{{% break %}}{{% endif %}}'
                    f'{{{{ m.content }}}}{{% endfor %}}"""\n')
    assert cli("create", "good", "-f", str(good)).returncode == 0
