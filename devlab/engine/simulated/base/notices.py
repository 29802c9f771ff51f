"""What the simulation says of itself once per process, on stderr."""

from __future__ import annotations

import sys
import threading


class Notice:
    """A line said once per process, on stderr (`tell`)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.told = threading.Event()

    def tell(self) -> None:
        if not self.told.is_set():
            self.told.set()
            # One write, line and newline together: ranks forked from a Jupyter kernel send
            # each write as its own message, and two ranks' writes would otherwise share a line.
            sys.stderr.write(self.text + "\n")
            sys.stderr.flush()
