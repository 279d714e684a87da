"""Switchboard's Python client: Flutter's platform channels over wire-v1, for tests and scripts.

``client = await switchboard.connect(host, port)``, then :class:`MethodChannel`, :class:`EventChannel`
and :class:`BasicMessageChannel` as in Flutter. The pytest plugin (``switchboard.pytest_plugin``,
loaded on install) starts servers for tests.
"""

__version__ = "0.1.0"

from .codec import (  # noqa: E402
    MAX_NESTING_DEPTH, BinaryCodec, Int64, JSONMessageCodec, JSONMethodCodec, MapEntries, MessageCodec, MethodCall,
    MethodCodec, ReadBuffer, StandardMessageCodec, StandardMethodCodec, StringCodec, WriteBuffer,
)
from .errors import (  # noqa: E402
    ConnectionClosedError, ForbiddenError, FormatError, MissingPluginException, PlatformException, RateLimitedError,
    RefusedError, ServerError, SessionLostError, SwitchboardError, UnauthorizedError,
)
from .session import FailedRequest, SessionEvent  # noqa: E402
from .client import Client, connect  # noqa: E402
from .channels import BasicMessageChannel, EventChannel, EventStream, MethodChannel  # noqa: E402

__all__ = [
    "connect", "Client", "MethodChannel", "EventChannel", "EventStream", "BasicMessageChannel",
    "MAX_NESTING_DEPTH", "Int64", "MapEntries", "MethodCall", "WriteBuffer", "ReadBuffer", "MessageCodec",
    "MethodCodec", "StandardMessageCodec", "StandardMethodCodec", "JSONMessageCodec", "JSONMethodCodec",
    "StringCodec", "BinaryCodec",
    "SwitchboardError", "FormatError", "PlatformException", "MissingPluginException", "ServerError",
    "UnauthorizedError", "RefusedError", "ForbiddenError", "RateLimitedError", "ConnectionClosedError",
    "SessionLostError", "SessionEvent", "FailedRequest",
]
