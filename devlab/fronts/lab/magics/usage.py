"""How devlab's magics read their own line: `parse_args` (one parser for all of them), and
`usage_errors`, which makes a mistake in the arguments a one-line `UsageError`.

A magic line may end with a `# comment`, as a line of Python or shell may: a `#` that starts
a word outside quotes begins a comment (the shell's rule), so `%device /GPU:0  # the GPU`
works, while `--file log#1.txt` and `--setup "x = 1  # one"` keep their `#`. IPython's own
magics take the comment as an argument; devlab's read it as a comment, in this one place.
"""

from __future__ import annotations

import contextlib
from argparse import Namespace
from collections.abc import Callable, Iterator
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

__all__ = ["parse_args", "strip_comment", "usage_errors"]

# What devlab raises for a bad name, option or setting. Anything else is a fault, not a
# mistake in the arguments, and keeps its traceback.
_MISTAKES = (ValueError, RuntimeError, TypeError)
_QUOTES = "'\""


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Turn devlab's errors about the arguments checked inside the block into a `UsageError`
    (IPython shows it as one line, with no traceback into devlab)."""
    try:
        yield
    except _MISTAKES as e:
        raise UsageError(_first_line(e)) from None


def parse_args(magic: Callable[..., Any], line: str) -> Namespace:
    """The arguments of a magic's line, as `IPython.core.magic_arguments` declares them:
    without a trailing `# comment`, and with the quotes IPython's splitting keeps taken off a
    quoted value (`--file "my log.txt"` is `my log.txt`). A mistake is a one-line `UsageError`."""
    try:
        args = parse_argstring(magic, strip_comment(line))
    except UsageError as e:
        raise UsageError(_first_line(e)) from None
    except ValueError as e:  # shlex: "No closing quotation"
        raise UsageError(f"{e} in the magic's line: {line.strip()!r}") from None
    for name, value in vars(args).items():
        if isinstance(value, str):
            setattr(args, name, _unquote(value))
        elif isinstance(value, list):
            setattr(args, name, [_unquote(v) if isinstance(v, str) else v for v in value])
    return args


def strip_comment(line: str) -> str:
    """`line` up to a `#` that starts a word outside quotes (and the spaces before it)."""
    quote = None
    word_start = True
    for i, c in enumerate(line):
        if quote is not None:
            if c == quote:
                quote = None
        elif c in _QUOTES:
            quote = c
        elif c == "#" and word_start:
            return line[:i].rstrip()
        word_start = c.isspace()
    return line


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
        return text[1:-1]
    return text


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
