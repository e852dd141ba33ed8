"""The prompt-lookup drafter (engine.strategies.LookupDrafter) as a pure piece: what follows the longest
n-gram (4 down to 2) seen before, as much as the match behind it is long (a run being copied: all that is
allowed; 3 to 11 tokens: 3; shorter: nothing), and never an image's positions (negative ids)."""

from __future__ import annotations

from localrun.engine.strategies import LookupDrafter


def drafted(tokens: list[int], k: int = 16) -> list[int]:
    d = LookupDrafter()
    d.reset(tokens)
    return d.propose(k)


COPIED = list(range(100, 120))  # 20 tokens written once, then copied again


def test_a_long_run_being_copied_drafts_all_that_is_allowed():
    tokens = COPIED + [7] + COPIED[:14]  # the copy agrees with the original for its last 14 tokens
    assert drafted(tokens) == COPIED[14:] + [7] + COPIED[:9]  # k = 16 tokens: the rest of the run and beyond
    assert drafted(tokens, k=4) == COPIED[14:18]


def test_a_short_match_drafts_three_and_a_bare_pair_nothing():
    assert drafted([1, 2, 3, 7, 8, 4, 9, 1, 2, 3]) == [7, 8, 4]  # a 3-token match
    assert drafted([5, 6, 9, 9, 1, 2, 5, 6]) == []  # only 2 tokens agree: a draft would cost more than it saves
    assert drafted([1, 2, 3, 4]) == []  # nothing repeats


def test_the_latest_occurrence_wins_and_extend_keeps_the_index():
    d = LookupDrafter()
    d.reset([1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3])
    assert d.propose(1) == [20]
    d.extend([30, 1, 2, 3])
    assert d.propose(1) == [30]


def test_an_images_positions_are_never_proposed():
    assert drafted([1, 2, 3, -5, -6, 4, 1, 2, 3]) == []
    assert drafted([1, 2, 3, 7, -5, -6, 1, 2, 3]) == [7]


def test_a_pause_after_misses_stops_short_drafts_but_not_a_copied_run():
    d = LookupDrafter()
    d.reset([1, 2, 3, 7, 8, 4, 9, 1, 2, 3])
    assert d.propose(16, long_only=True) == []  # a 3-token match: paused
    d.reset(COPIED + [7] + COPIED[:14])
    assert d.propose(16, long_only=True) == COPIED[14:] + [7] + COPIED[:9]
