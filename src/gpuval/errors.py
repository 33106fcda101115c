"""Exceptions that carry the process exit code of the ARCHITECTURE contract.

0 PASS · 1 FAIL · 2 usage or input error · 3 ERROR (the run itself could not complete).
"""

from __future__ import annotations

import unicodedata

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3


class GpuvalError(Exception):
    """An error a person can act on: printed as one line, never as a traceback."""

    exit_code = EXIT_ERROR


class UsageError(GpuvalError):
    """Bad input: a broken YAML, an unknown name, an unwritable path, a wrong --set value."""

    exit_code = EXIT_USAGE


class RunError(GpuvalError):
    """The tool could not complete its work: a crashed rank, a timeout, a missing device."""

    exit_code = EXIT_ERROR


class LostPeers(RunError):
    """A collective broke because another rank died or went silent: the consequence of that rank's
    error, said after it (rank_lines.gathered_line)."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM (or SIGHUP/SIGQUIT) ended the run: exit 128 + the signal's number, one line.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` in the work swallows it."""

    def __init__(self, signum: int, detail: str = "") -> None:
        import signal

        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        super().__init__(f"interrupted ({name})" + (f"; {detail}" if detail else ""))


def first_line(exc: BaseException) -> str:
    """An exception's message as one line for a person: its first line, or its type when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# Characters that end a line for str.splitlines() or a terminal, or that a terminal acts on: control
# characters (\n, \r, \x1b, \x85, ...) and the Unicode line and paragraph separators.
_UNPRINTABLE = ("Cc", "Zl", "Zp")


def one_line(text: str) -> str:
    """`text` with every control character written as Python writes it in a string literal (a newline
    as \\n, ESC as \\x1b): a bad value echoed back keeps the message one line and shows what was there."""
    if text.isprintable():
        return text
    return "".join(repr(char)[1:-1] if unicodedata.category(char) in _UNPRINTABLE else char for char in text)
