"""Terminal text built from untrusted strings (file content, config values, engine output).

Rich reads ``[...]`` in a plain string as markup: a file holding ``[/]`` would crash the
printer and ``[link=...]`` would forge a hyperlink. Everything here returns a
:class:`rich.text.Text` whose content is taken literally, with control characters (terminal
escape sequences, carriage returns) shown as ``\\xNN`` instead of being sent to the terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook
from rich.segment import Segment
from rich.text import Text

#: C0 controls but tab and newline, DEL, the C1 controls (ESC and CSI start terminal
#: sequences), and the Unicode controls that reorder or break lines on display (bidi
#: overrides and isolates, line and paragraph separators).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any) -> str:
    """`text` as a string with control characters spelled ``\\xNN`` (``\\uNNNN``).

    The one sanitising function of every renderer: terminal text, table cells in every
    format, the HTML report. Text from files, configurations and engines goes through it
    before it is shown or written, so no escape sequence reaches a terminal or a file."""
    text = str(text)
    return CONTROL.sub(_spelled, text) if CONTROL.search(text) else text


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


class _Escaped:
    """A renderable whose text segments are passed through :func:`printable` (the styles and
    cursor controls rich adds itself are kept)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.inner, options):
            if segment.control or not CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style)


class EscapeControls(RenderHook):
    """A console render hook that shows control characters escaped in whatever is printed:
    the last guard behind :func:`literal` and the renderers, so a string printed as it is
    still cannot move the cursor or restyle the terminal."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Escaped(r) for r in renderables]


class PrintableBytes:
    """A binary stream whose writes reach `raw` through :func:`printable`: UTF-8 decoded as
    it comes (a character split between two writes is held until its last byte), control
    characters spelled out, undecodable bytes passed on as they were. For text an engine
    streams (a prompt echoed, a generated answer) on its way to a terminal or a file."""

    def __init__(self, raw: Any):
        import codecs

        self.raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")

    def write(self, data: bytes) -> int:
        self._put(self._decoder.decode(bytes(data)))
        return len(data)

    def _put(self, text: str) -> None:
        if text:
            self.raw.write(printable(text).encode("utf-8", "surrogateescape"))

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        """Write what is held of a cut character (its bytes, as they came)."""
        self._put(self._decoder.decode(b"", final=True))
        self.raw.flush()


def guarded(console: Console) -> Console:
    """`console` with :class:`EscapeControls` installed (returned for chaining)."""
    console.push_render_hook(EscapeControls())
    return console
