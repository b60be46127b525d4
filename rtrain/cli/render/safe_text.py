"""Text from outside rtrain (a worker's error, a store's record, an events file, a user's
file) as rich shows it: a `Text`, never markup, so `[/...]` in a Python message prints
as itself instead of raising MarkupError; control characters (ANSI escapes, a carriage
return) and unpaired surrogates (undecodable bytes read with surrogateescape) shown
escaped, never sent to the terminal; a very long value cut, saying how much was cut."""

from __future__ import annotations

from rich.text import Text

# characters kept as they are: a table cell or a traceback may hold lines and tabs
KEPT = frozenset("\n\t")
# a cell longer than this is cut (a traceback is printed whole: limit=None)
CELL_LIMIT = 600


def _escaped(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def _unsafe(char: str) -> bool:
    code = ord(char)
    if char in KEPT:
        return False
    # C0, DEL, C1, lone surrogates, and the bidi overrides that reorder what follows
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xDFFF
        or 0x202A <= code <= 0x202E
        or 0x2066 <= code <= 0x2069
    )


def shown(value: object, limit: int | None = CELL_LIMIT) -> str:
    """`value` as a string safe for a terminal: control characters escaped (\\x1b), cut
    at `limit` characters (None: whole)."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    if not any(_unsafe(c) for c in text):
        return text
    return "".join(_escaped(c) if _unsafe(c) else c for c in text)


def plain(value: object, style: str = "", limit: int | None = CELL_LIMIT) -> Text:
    """`value` as rich Text (no markup parsed), escaped as `shown` does."""
    return Text(shown(value, limit), style=style)
