"""Resumable sessions (protocol/resumption.md): what the client tells the application, and one session's positions
and the part of its own stream it keeps until the server acknowledges it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

__all__ = ["SessionEvent", "FailedRequest"]

#: ERROR codes after which the server closes the connection: such an ERROR is not in the server's stream.
CLOSING_ERRORS = frozenset({"malformed_frame", "frame_too_large", "unauthorized", "bad_hello", "unsupported_version",
                            "slow_consumer", "timeout", "session_taken"})


@dataclass(frozen=True)
class FailedRequest:
    """A request written on a session that could not be resumed: it failed with :class:`SessionLostError`."""

    id: int
    channel: str


@dataclass(frozen=True)
class SessionEvent:
    """What happened to a resumable client's session after its connection dropped, or when the server ended it.

    - ``kind == "resumed"``: nothing was lost.
    - ``kind == "restarted"``: the session could not be resumed (``reason``: a ``cannot_resume`` reason, or the
      client's own ``unsupported``, ``position``, ``expired``, ``taken``). The client made a new session on a
      new or the same connection (none after ``unsupported``), registered ``channels`` again and listened to
      ``streams`` again; each of those streams may have missed events. ``failed`` are the requests that failed
      with :class:`SessionLostError`.
    - ``kind == "ended"``: the session ended and the client goes on without one (``reason`` ``overflowed``
      from the server's END: ``streams`` may have missed events, nothing else is lost), or the client could not
      reach the server again (``reason`` ``expired``, ``failed`` as for ``restarted``; the client is closed).
    """

    kind: str
    reason: Optional[str] = None
    streams: Tuple[str, ...] = ()
    channels: Tuple[str, ...] = ()
    failed: Tuple[FailedRequest, ...] = ()


class Outgoing:
    """One frame of the client's stream: its bytes, and what a fallback needs to know of it."""

    __slots__ = ("data", "type", "id", "channel")

    def __init__(self, data: bytes, frame_type: int, frame_id: int, channel: str) -> None:
        self.data = data
        self.type = frame_type
        self.id = frame_id
        self.channel = channel


class SessionStreams:
    """The positions of one session's two streams, and the client's frames from the server's acknowledged position
    on: ``unacked`` were written to a connection, ``unwritten`` wait for one (or for room under ``bound``)."""

    def __init__(self, granted: Dict[str, Any], bound: int) -> None:
        self.token = str(granted["token"])
        self.ttl_ms = _number(granted.get("ttlMs"), 60_000)
        self.ack_bytes = max(1, _number(granted.get("ackBytes"), 65_536))
        self.ack_ms = max(1, _number(granted.get("ackMs"), 1_000))
        self.bound = bound
        self.sent = 0  # bytes of the client's stream made so far
        self.written = 0  # … of which handed to a connection
        self.acked = 0  # … of which the server has acknowledged: the oldest byte kept
        self.unacked: Deque[Outgoing] = deque()
        self.unwritten: Deque[Outgoing] = deque()
        self.received = 0  # bytes of the server's stream received and handled, whole frames
        self.told = 0  # the received position last told to the server (POSITION, or a resuming HELLO)

    def append(self, frame: Outgoing) -> None:
        self.unwritten.append(frame)
        self.sent += len(frame.data)

    def writable(self) -> Iterator[bytes]:
        """Moves frames from ``unwritten`` to ``unacked`` while what is written and unacknowledged stays within
        ``bound`` (one frame always goes, however large), and yields their bytes to write."""
        while self.unwritten:
            size = len(self.unwritten[0].data)
            if self.written > self.acked and self.written + size - self.acked > self.bound:
                return
            frame = self.unwritten.popleft()
            self.unacked.append(frame)
            self.written += size
            yield frame.data

    @property
    def over_bound(self) -> bool:
        """True while more than ``bound`` bytes are kept: the application waits before making more."""
        return self.sent - self.acked > self.bound

    def acknowledge(self, position: int) -> bool:
        """Forgets the frames before the server's received `position`; False if it is not one the server can have."""
        if not self.acked <= position <= self.written:
            return False
        while self.unacked and self.acked + len(self.unacked[0].data) <= position:
            self.acked += len(self.unacked.popleft().data)
        return self.acked == position

    def rewind(self, position: int) -> bool:
        """After a resuming WELCOME: forgets what the server had, and makes what it missed unwritten again, to go
        first. False when `position` is outside what the client kept (the session cannot go on)."""
        if not self.acknowledge(position):
            return False
        self.unwritten.extendleft(reversed(self.unacked))
        self.unacked.clear()
        self.written = position
        return True

    def take_unwritten(self) -> List[Outgoing]:
        """The frames never written to any connection, taken out (a fallback sends some on the new session)."""
        frames = list(self.unwritten)
        self.unwritten.clear()
        return frames


def _number(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
