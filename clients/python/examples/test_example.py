import pytest

import switchboard
from switchboard import BasicMessageChannel, EventChannel, MethodChannel, StringCodec


async def test_echo(switchboard_client):
    echo = MethodChannel("switchboard/echo", switchboard_client)
    assert await echo.invoke_method("echo", {"hello": [1, 2.5, "x"]}) == {"hello": [1, 2.5, "x"]}


async def test_errors(switchboard_client):
    echo = MethodChannel("switchboard/echo", switchboard_client)
    with pytest.raises(switchboard.PlatformException) as raised:
        await echo.invoke_method("fail", "why")
    assert raised.value.code == "demo_error" and raised.value.details == "why"
    with pytest.raises(switchboard.MissingPluginException):
        await echo.invoke_method("no_such_method")


async def test_stream(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    ticks = [tick async for tick in ticker.receive_broadcast_stream({"count": 3, "intervalMs": 0})]
    assert ticks == [0, 1, 2]


async def test_message(switchboard_client):
    strings = BasicMessageChannel("switchboard/message.string", StringCodec(), switchboard_client)
    assert await strings.send("hi") == "hi"


@pytest.mark.switchboard("--token", "s3cret")
async def test_with_a_token(switchboard_server, switchboard_client):
    assert await switchboard_client.ping() is None  # switchboard_client sent the server's token
    with pytest.raises(switchboard.UnauthorizedError):
        await switchboard.connect(switchboard_server.host, switchboard_server.port, token="wrong")
