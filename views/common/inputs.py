"""Number inputs that show their allowed range and say what is wrong when a value is outside it.

A number_input with min_value/max_value turns red on an out-of-range entry and never sends it, so the button after
it does nothing and says nothing. These inputs take any number, show the range in the label, and the page checks
the values when a button is pressed (refused()), saying which value is wrong and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st


def _fmt(v: float) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


@dataclass(frozen=True)
class Bounded:
    label: str
    lo: float
    hi: float
    value: float

    @property
    def problem(self) -> str | None:
        if self.lo <= self.value <= self.hi:
            return None
        return (f"{self.label} must be between {_fmt(self.lo)} and {_fmt(self.hi)}; it is {_fmt(self.value)}. "
                "Enter a value in that range.")


def number(label: str, lo: float, hi: float, value: float, where=st, **kw) -> Bounded:
    """A number input labelled with its allowed range ("New tokens (1 to 1,024)"); integers when lo and value are."""
    v = where.number_input(f"{label} ({_fmt(lo)} to {_fmt(hi)})", value=value,
                           step=kw.pop("step", 1 if isinstance(value, int) else 0.1), **kw)
    return Bounded(label, lo, hi, v)


def refused(*inputs: Bounded, where=st) -> bool:
    """Show an error for each input outside its range; True when there was one (the caller runs nothing)."""
    bad = [b.problem for b in inputs if b.problem]
    for msg in bad:
        where.error(msg)
    return bool(bad)
