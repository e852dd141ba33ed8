"""The prompt-lookup drafter (engine.strategies.LookupDrafter) as a pure piece: what it proposes after the
longest n-gram (4 down to 2) seen before, and never an image's positions (negative ids in a vision prompt)."""

from __future__ import annotations

from localrun.engine.strategies import LookupDrafter


def drafted(tokens: list[int], k: int = 8) -> list[int]:
    d = LookupDrafter()
    d.reset(tokens)
    return d.propose(k)


def test_it_proposes_what_followed_the_last_tokens_before():
    assert drafted([1, 2, 3, 7, 8, 4, 1, 2, 3]) == [7, 8, 4, 1, 2, 3]
    assert drafted([1, 2, 3, 7, 8, 4, 1, 2, 3], k=2) == [7, 8]
    assert drafted([5, 6, 9, 9, 1, 2, 5, 6]) == [9, 9, 1, 2, 5, 6]  # the 2-gram where no longer one matches
    assert drafted([1, 2, 3, 4]) == []  # nothing repeats


def test_the_latest_occurrence_wins_and_extend_keeps_the_index():
    d = LookupDrafter()
    d.reset([1, 2, 10, 1, 2, 20, 1, 2])
    assert d.propose(1) == [20]
    d.extend([30, 1, 2])
    assert d.propose(1) == [30]


def test_an_images_positions_are_never_proposed():
    assert drafted([1, 2, 3, -5, -6, 4, 1, 2, 3]) == []
    assert drafted([1, 2, 3, 7, -5, -6, 1, 2, 3]) == [7]
