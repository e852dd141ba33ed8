"""Reasoning models' thinking, kept apart from the answer (engine.formats.thinking: the markers, the splitter) and
which markers a chat template's family writes (engine.formats): the names the rest of localrun reads them by."""

from .formats import markers_for, thinking_in  # noqa: F401
from .formats.thinking import (GPT_OSS, THINK, Markers, ThinkingSplitter, has_switch, opened_in_prompt,  # noqa: F401
                               opens_for, splitter_for)
