"""argparse types: the value types of settings/types.py, refusing with argparse's usage message. Every command's
flags use these, so a number is checked the same way on the command line, in the environment and in the file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sluicegate.settings import types as t


def argtype(parse: Callable[[Any], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse type: its ValueError becomes the usage error, with the reason."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__.replace("_", " ")
    return convert


positive_int = argtype(t.positive_int)
nonnegative_int = argtype(t.nonnegative_int)
positive_seconds = argtype(t.positive_seconds)
positive_hours = argtype(t.positive_hours)
positive_days = argtype(t.positive_days)
seconds_or_none = argtype(t.seconds_or_none)
speculative = argtype(t.speculative)

__all__ = ["argtype", "nonnegative_int", "positive_days", "positive_hours", "positive_int", "positive_seconds",
           "seconds_or_none", "speculative"]
