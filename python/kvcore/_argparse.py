"""The argument parser of every kvcore command: an error is one line and a pointer to --help."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line on stderr,
    ``<prog>: error: <message>; see <prog> --help``, exit status 2, instead of the
    usage block before the line that matters. Subparsers made from it are of this
    class too (argparse makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        """Prints the one-line error and exits with status 2."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")
