"""A client for the native engine's ``--session`` protocol: one process, the model loaded
once, many ``generate`` requests over a warm cache.

The client writes requests on the engine's stdin and reads its stdout on a thread, so a turn
can time out or be cancelled while the engine is busy. Each turn's result is the engine's
``BMOE_DONE`` (tokens, tok/s, prefill, cache, text); a rejected request's ``BMOE_ERROR`` is
raised as :class:`SessionRequestError` and leaves the session usable, a fatal one ends it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from bmoe.errors import BmoeError
from bmoe.formats import protocol


class SessionError(BmoeError):
    """The session ended (fatal BMOE_ERROR, the engine exited) or stopped answering."""


class SessionRequestError(BmoeError):
    """The engine rejected one request (``BMOE_ERROR`` with ``fatal: false``)."""

    def __init__(self, request_id: int, message: str):
        self.request_id = request_id
        self.message = message
        super().__init__(f"session request {request_id} rejected: {message}")


@dataclass
class Turn:
    """One generation: what the engine said between ``BMOE_BEGIN`` and ``BMOE_DONE``."""

    id: int
    done: dict[str, Any] = field(default_factory=dict)
    progress: list[dict[str, Any]] = field(default_factory=list)
    cancelled: bool = False
    timed_out: bool = False  # the client cancelled it for running past its timeout
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return int(self.done.get("tokens", len(self.progress)))

    @property
    def tok_s(self) -> float | None:
        value = self.done.get("tok_s")
        return float(value) if isinstance(value, int | float) else None

    @property
    def text(self) -> str:
        return protocol.printable(str(self.done.get("text", "")))


_EOF = object()


class SessionClient:
    """Talks to a running ``bmoe-cli --session`` through its stdin and stdout pipes.

    `on_line` sees every raw stdout line (e.g. to archive the stream) before it is parsed.
    """

    def __init__(
        self,
        stdin: IO[bytes],
        stdout: IO[bytes],
        *,
        on_line: Callable[[bytes], None] | None = None,
    ):
        self._stdin = stdin
        self._events: queue.Queue = queue.Queue()
        self._on_line = on_line
        self._next_id = 1
        self.ready: dict[str, Any] | None = None
        self.closed = False
        self._reader = threading.Thread(target=self._read, args=(stdout,), daemon=True)
        self._reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        try:
            for line in iter(stdout.readline, b""):
                if self._on_line is not None:
                    self._on_line(line)
                try:
                    event = protocol.parse_line(line)
                except BmoeError:
                    continue
                if event is not None:
                    self._events.put(event)
        finally:
            self._events.put(_EOF)

    def _next_event(self, deadline: float | None) -> Any:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            raise SessionError("the engine did not answer in time") from None
        if event is _EOF:
            self.closed = True
            raise SessionError("the engine ended the session (its output closed)")
        return event

    def _send(self, line: str) -> None:
        if self.closed:
            raise SessionError("the session is closed")
        try:
            self._stdin.write(line.encode("utf-8") + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.closed = True
            raise SessionError("the engine is no longer reading requests") from None

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for ``BMOE_READY`` (the model is loaded); returns its data."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ready is None:
            event = self._next_event(deadline)
            if event.tag == "READY":
                self.ready = dict(event.data)
            elif event.tag == "ERROR":
                self._raise_error(event.data, None)
        return self.ready

    def _raise_error(self, data: dict[str, Any], request_id: int | None) -> None:
        message = protocol.printable(str(data.get("msg", "")))
        if data.get("fatal", True):
            self.closed = True
            raise SessionError(f"the engine failed: {message}")
        raise SessionRequestError(int(data.get("id", request_id or -1)), message)

    def generate(
        self,
        prompt: str,
        *,
        n_predict: int | None = None,
        think: bool | None = None,
        clear_kv: bool | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        cancel_after: int | None = None,
    ) -> Turn:
        """Run one generation and return its :class:`Turn` (from ``BMOE_DONE``).

        `cancel_after` sends ``cancel`` once that many tokens arrived (the turn then ends
        with ``cancelled``); on `timeout` the turn is cancelled and :class:`SessionError`
        raised if the engine does not stop within a few seconds.
        """
        if self.ready is None:
            self.wait_ready(timeout)
        request_id = self._next_id
        self._next_id += 1
        fields: dict[str, Any] = {"id": request_id, "prompt": prompt}
        if n_predict is not None:
            fields["n_predict"] = int(n_predict)
        if think is not None:
            fields["think"] = bool(think)
        if clear_kv is not None:
            fields["clear_kv"] = bool(clear_kv)
        started = time.monotonic()
        self._send(protocol.encode_request("generate", **fields))
        turn = Turn(request_id)
        deadline = None if timeout is None else started + timeout
        cancel_sent = False
        while True:
            try:
                event = self._next_event(deadline)
            except SessionError:
                if self.closed or cancel_sent:
                    raise
                turn.timed_out = True
                self.cancel()
                cancel_sent = True
                deadline = time.monotonic() + 5.0
                continue
            tag, data = event.tag, event.data
            if tag == "PROGRESS":
                turn.progress.append(dict(data))
                if on_progress is not None:
                    on_progress(dict(data))
                if (
                    cancel_after is not None
                    and len(turn.progress) >= cancel_after
                    and not (cancel_sent)
                ):
                    self.cancel()
                    cancel_sent = True
            elif tag == "DONE" and data.get("id", request_id) == request_id:
                turn.done = dict(data)
                turn.cancelled = bool(data.get("cancelled", False))
                turn.wall_s = time.monotonic() - started
                return turn
            elif tag == "ERROR" and data.get("id", request_id) in (request_id, -1):
                self._raise_error(data, request_id)

    def cancel(self) -> None:
        """Interrupt the generation in flight (the session stays loaded)."""
        self._send(protocol.encode_request("cancel"))

    def close(self) -> None:
        """End the session (the engine exits)."""
        if not self.closed:
            with contextlib.suppress(SessionError):
                self._send(protocol.encode_request("close"))
            with contextlib.suppress(OSError):
                self._stdin.close()
        self.closed = True
