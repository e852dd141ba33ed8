"""ps says until when a model stays as Ollama's ps says it ("4 minutes from now", "Forever"), where it printed raw
timestamps (2026-12-01T15:26:35+00:00, and 2319-03-13T15:19:17+00:00 for --keep-alive -1); --json keeps the
timestamp. The installed command and the real background server; the words' rules alone, fast."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from conftest import run_cli


def until_column(table: str, name: str) -> str:
    header, *rows = [line for line in table.splitlines() if line.strip()]
    row = next(r for r in rows if name in r)
    start = header.index("UNTIL")
    return row[start:header.index("SIZE IS")].strip()


@pytest.mark.slow
def test_ps_says_until_when_in_words(resident, smollm2):
    assert run_cli("run", str(smollm2), "-n", "1", "--threads", "1", "--keep-alive", "5m", "Hi").returncode == 0
    assert until_column(run_cli("ps").stdout, smollm2.name) in ("4 minutes from now", "5 minutes from now")
    (model,) = json.loads(run_cli("ps", "--json").stdout)
    datetime.fromisoformat(model["expires_at"])  # a timestamp, as Ollama's /api/ps gives it
    assert run_cli("run", str(smollm2), "-n", "1", "--threads", "1", "--keep-alive", "-1", "Hi").returncode == 0
    assert until_column(run_cli("ps").stdout, smollm2.name) == "Forever"


def test_the_words_follow_ollamas():
    from localrun.cli.render import human_duration, until_text

    now = time.time()

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(now + seconds, timezone.utc).isoformat()

    assert until_text(at(299.5), 300, now) == "4 minutes from now"
    assert until_text(at(90), 300, now) == "About a minute from now"
    assert until_text(at(30.5), 300, now) == "30 seconds from now"
    assert until_text(at(3 * 3600), 3 * 3600, now) == "3 hours from now"
    assert until_text(at(292 * 365 * 86400), None, now) == "Forever"  # keep-alive -1: Ollama's far future
    assert until_text(at(-1), 0, now) == "Stopping..."
    assert human_duration(0.2) == "Less than a second" and human_duration(3600) == "About an hour"
    assert human_duration(10 * 86400) == "10 days" and human_duration(3 * 365 * 86400) == "3 years"
