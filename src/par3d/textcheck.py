"""Is a file text?  The training data's gate (no torch, no numpy: `config.validate()` uses it).

The byte tokenizer would read any file, so an executable or random bytes would train without a
word and the loss would mean nothing.  A file is taken as text when its first `_SNIFF` bytes hold
no NUL byte, few control characters, and decode as UTF-8 for the most part (the rules of
file(1) and of git's binary detection, loosened for text in other 8-bit encodings).
"""

from __future__ import annotations

import os

_SNIFF = 8192
# control bytes that text holds: tab, newline, vertical tab, form feed, carriage return, escape
_TEXT_CONTROLS = frozenset(b"\t\n\x0b\x0c\r\x1b\x08")


def binary_reason(path: str) -> str | None:
    """Why the file at `path` is not text, or None when it looks like text."""
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF)
    if not head:
        return None
    if b"\0" in head:
        return f"holds NUL bytes (offset {head.index(0)}): a binary file (an executable, an archive, an image)"
    controls = sum(1 for b in head if (b < 0x20 and b not in _TEXT_CONTROLS) or b == 0x7F)
    if controls > len(head) // 100:
        return f"{100 * controls / len(head):.0f} % of its first {len(head)} bytes are control characters"
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    if bad > len(text) // 10:
        return f"{100 * bad / len(text):.0f} % of its first {len(head)} bytes are not UTF-8 text"
    return None


def text_files(folder: str) -> tuple[list[str], list[str]]:
    """(non-empty text files, binary files) under `folder`, each sorted by path."""
    text, binary = [], []
    for path in sorted(os.path.join(r, f) for r, _d, fs in os.walk(folder) for f in fs):
        try:
            if os.path.getsize(path) == 0:
                continue
            (binary if binary_reason(path) else text).append(path)
        except OSError:
            continue
    return text, binary
