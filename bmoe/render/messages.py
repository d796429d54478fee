"""Terminal text built from untrusted strings (file content, config values, engine output).

Rich reads ``[...]`` in a plain string as markup: a file holding ``[/]`` would crash the
printer and ``[link=...]`` would forge a hyperlink. Everything here returns a
:class:`rich.text.Text` whose content is taken literally, with control characters (terminal
escape sequences, carriage returns) shown as ``\\xNN`` instead of being sent to the terminal.
"""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text

#: C0 controls but tab and newline, DEL, and the C1 controls (ESC starts terminal sequences).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """`text` as a string with control characters spelled ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def literal(text: Any, style: str = "") -> Text:
    """`text` as terminal text, never read as markup."""
    return Text(printable(text), style=style)


def labelled(label: str, style: str, message: Any) -> Text:
    """``label message``: the label styled, the message literal."""
    return Text.assemble((label, style), " ", printable(message))


def error_line(message: Any) -> Text:
    return labelled("error:", "bold red", message)


def warning_line(message: Any) -> Text:
    return labelled("warning:", "yellow", message)


def note_line(message: Any, label: str = "NOTE") -> Text:
    return labelled(label, "bold yellow", message)
