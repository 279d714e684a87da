"""The exceptions of the client.

Every failed answer is a :class:`PlatformException` (code, message, details), as in Flutter: an error
envelope from a handler is one, and so is an ERROR frame from the server itself, as the subclass
:class:`ServerError`. Refusals by the server's plugins are :class:`RefusedError`
(:class:`ForbiddenError`, :class:`RateLimitedError`), so that a test can tell them from a broken
connection and from a handler's error.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "SwitchboardError", "FormatError", "PlatformException", "MissingPluginException", "ServerError",
    "UnauthorizedError", "RefusedError", "ForbiddenError", "RateLimitedError", "ConnectionClosedError",
    "SessionLostError",
]


class SwitchboardError(Exception):
    """The base of every exception this package raises."""


class FormatError(SwitchboardError, ValueError):
    """Bytes that cannot be decoded, or a value that cannot be encoded."""

    def __init__(self, message: str, offset: Optional[int] = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte {offset})")
        self.offset = offset


class PlatformException(SwitchboardError):
    """An error answer: Flutter's PlatformException. ``message``, ``details`` and ``stacktrace`` may be None."""

    def __init__(self, code: str, message: Optional[str] = None, details: Any = None,
                 stacktrace: Optional[str] = None) -> None:
        super().__init__(code if message is None else f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details
        self.stacktrace = stacktrace

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, {self.details!r})"


class MissingPluginException(SwitchboardError):
    """A method answered "not implemented" (a null reply, also when nobody handles the channel)."""


class ServerError(PlatformException):
    """An ERROR frame from the server (wire-v1 section 2): ``code`` is the spec's, such as ``bad_payload``,
    ``duplicate_id``, ``handler_gone``, ``going_away``, ``cancelled`` or ``channel_taken``."""

    @staticmethod
    def of(code: str, message: Optional[str] = None, details: Any = None) -> "ServerError":
        """The exception for an ERROR frame's code: a refusal type when it is one."""
        cls = _ERRORS_BY_CODE.get(code, ServerError)
        return cls(code, message, details)


class UnauthorizedError(ServerError):
    """``unauthorized``: the token was missing or wrong. The server closes the connection after it."""


class RefusedError(ServerError):
    """A request a plugin refused (``forbidden``, ``rate_limited``); the connection stays open."""


class ForbiddenError(RefusedError):
    """``forbidden``: the client has no right to this call, send, listen or REGISTER."""


class RateLimitedError(RefusedError):
    """``rate_limited``: over a rate limit; :attr:`retry_after_ms` says when a request would be accepted."""

    @property
    def retry_after_ms(self) -> Optional[int]:
        """``details["retryAfterMs"]``: milliseconds until a request would be accepted."""
        if isinstance(self.details, dict):
            return self.details.get("retryAfterMs")
        return None


class ConnectionClosedError(SwitchboardError, ConnectionError):
    """The connection ended before the answer came.

    ``error`` is the ERROR frame that closed it, if one did (such as ``slow_consumer``), and
    ``goaway`` the reason of the server's GOAWAY, if it sent one.
    """

    def __init__(self, message: str, error: Optional[ServerError] = None, goaway: Optional[str] = None) -> None:
        super().__init__(message if error is None else f"{message}: {error}")
        self.error = error
        self.goaway = goaway


class SessionLostError(PlatformException):
    """``session_lost``: a request written on a resumable session that could not be resumed. The server may
    have run it (as with ``handler_gone``); ``reason`` is why the session was lost (``details["reason"]``:
    a ``cannot_resume`` reason of protocol/resumption.md, or the client's own ``unsupported``,
    ``position``, ``expired``, ``taken``). Not a :class:`ConnectionClosedError`: the client goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__("session_lost", f"the session was lost ({reason}); the request may have run", {"reason": reason})
        self.reason = reason


_ERRORS_BY_CODE = {
    "unauthorized": UnauthorizedError,
    "forbidden": ForbiddenError,
    "rate_limited": RateLimitedError,
}
