"""The console's errors: one root, TriageError, for every error whose message a user should read.

Pages and the CLI catch TriageError and show its message; anything else is a bug and keeps its traceback. Each class
also keeps the builtin base its callers caught before (ValueError for refused input, RuntimeError for a failure), so
`except ValueError` around a parser still works. Feature-specific errors live beside their feature and subclass one of
these.
"""
from __future__ import annotations


class TriageError(Exception):
    """Root of every error whose message is written for the user: what failed, what was found, what to do."""


class InputError(TriageError, ValueError):
    """A value the user gave (a flag, a widget, a file) is refused; the message says what is accepted."""


class ToolError(TriageError, RuntimeError):
    """A program the console runs (vLLM's interpreter, a parser dump) did not work; the message says how it failed."""


class EngineError(TriageError, RuntimeError):
    """An engine could not load, generate or score; the message says why and what to use instead."""


class RemoteError(EngineError):
    """The server could not be reached or did not answer like a vLLM/OpenAI server.

    Here rather than in core/engines/remote.py because core/http.py raises it too, below the engines; it stays an
    EngineError because the remote engine raises it wherever an engine error is caught."""


class NonFiniteAnswer(RemoteError):
    """The server answered, but its numbers held NaN or infinity, which vLLM cannot write as JSON: its forward pass
    overflowed or its weights are corrupt. An answer about the server's health, not a failure to reach it."""
