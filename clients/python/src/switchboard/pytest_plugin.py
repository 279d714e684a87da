"""pytest fixtures that start Switchboard servers for tests (loaded on install, through the ``pytest11`` entry point).

- ``switchboard_server``: a fresh server for the test, with the arguments of the test's
  ``@pytest.mark.switchboard("--token", "s3cret", …)`` marker (``switchboard serve`` options), on a free port.
- ``switchboard_client``: a client connected to it (with the server's ``--token``), for ``async def`` tests;
  ``@pytest.mark.switchboard_client(resumable=True, …)`` passes options to :func:`switchboard.connect`.
- ``switchboard_cut_seed``: a seed for a :class:`~switchboard.cutting_proxy.CuttingProxy` (a proxy that cuts
  connections at random byte offsets, to test resumable sessions), printed so that a failing test shows it;
  ``SWITCHBOARD_CUT_SEED`` sets it.
- ``switchboard_server_factory``: ``start(*args)`` starts one more server; every one is stopped after the test.

The binary is ``$SWITCHBOARD`` or ``switchboard`` on the PATH. Each server is stopped with SIGTERM and must
exit with status 0 (a graceful drain), or the test fails at teardown with the server's log.

The plugin also runs ``async def`` tests, each in a fresh event loop (``asyncio.run``), unless
pytest-asyncio, anyio or pytest-trio has marked them as theirs.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import pytest

from .client import Client, connect

__all__ = ["SwitchboardServer", "ServerStartError"]

_LISTENING = re.compile(r"listening on \[?([^\s\]]+?)\]?:(\d+)")
_LISTENING_TLS = re.compile(r"listening for TLS on \[?([^\s\]]+?)\]?:(\d+)")


class ServerStartError(Exception):
    """The server did not start listening: the message has its command line, exit status and log."""


@dataclass
class SwitchboardServer:
    """A running ``switchboard serve``: where it listens, and its log so far."""

    host: str
    port: int
    tls_port: Optional[int]
    token: Optional[str]
    args: List[str]
    process: subprocess.Popen = field(repr=False)
    _log: List[str] = field(repr=False, default_factory=list)
    _log_reader: Optional[threading.Thread] = field(repr=False, default=None)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> str:
        """Everything the server has written to stdout and stderr so far."""
        return "".join(self._log)

    async def connect(self, **options: Any) -> Client:
        """A client connected to this server (with its ``--token`` unless `options` give one)."""
        options.setdefault("token", self.token)
        return await connect(self.host, self.port, **options)

    def stop(self, timeout: float = 30.0) -> int:
        """Sends SIGTERM, waits for the exit and returns the exit status (SIGKILL after `timeout`, then -9)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_reader is not None:
            self._log_reader.join()  # the output is complete: the log holds the server's last words
        return self.process.returncode


def switchboard_binary() -> str:
    """``$SWITCHBOARD``, else ``switchboard`` on the PATH."""
    configured = os.environ.get("SWITCHBOARD")
    if configured:
        if not os.access(configured, os.X_OK):
            raise ServerStartError(f"$SWITCHBOARD is {configured!r}, which is not an executable file")
        return configured
    found = shutil.which("switchboard")
    if found is None:
        raise ServerStartError("no switchboard binary: set $SWITCHBOARD to its path or put it on the PATH "
                               "(swift build puts it in .build/debug/switchboard)")
    return found


def _option(args: List[str], name: str) -> Optional[str]:
    """The value of `name` in `args` (``--name value`` or ``--name=value``), the last one given."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def start_server(args: List[str], timeout: float = 60.0, env: Optional[Dict[str, str]] = None) -> SwitchboardServer:
    """Starts ``switchboard serve`` with `args` on a free port (``--port 0`` unless `args` give a port) and returns
    once its "listening" log line names the port. Raises :class:`ServerStartError` if it exits or says nothing
    for `timeout` seconds."""
    args = [str(arg) for arg in args]
    command = [switchboard_binary(), "serve"]
    if _option(args, "--port") is None:
        command += ["--port", "0"]
    if _option(args, "--log-level") is None:
        command += ["--log-level", "notice"]  # the "listening" line is a notice
    if _option(args, "--tls-cert") is not None and _option(args, "--tls-port") is None:
        command += ["--tls-port", "0"]
    command += args
    wants_tls = _option(args, "--tls-cert") is not None
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env, text=True, errors="replace")
    log: List[str] = []
    found: Dict[str, Any] = {}
    ready = threading.Event()

    def read_log() -> None:
        # Drains the server's output for its whole life (a full pipe would block it), noting the ports.
        with process.stdout:
            for line in process.stdout:
                log.append(line)
                for key, pattern in (("plain", _LISTENING), ("tls", _LISTENING_TLS)):
                    match = pattern.search(line)
                    if match and key not in found:
                        found[key] = (match.group(1), int(match.group(2)))
                if "plain" in found and ("tls" in found or not wants_tls):
                    ready.set()
        ready.set()  # the output ended: the server exited

    reader = threading.Thread(target=read_log, name=f"switchboard-log-{process.pid}", daemon=True)
    reader.start()
    started = ready.wait(timeout)
    if "plain" not in found or (wants_tls and "tls" not in found):
        if process.poll() is None:
            process.kill()
        status = process.wait()
        reader.join()
        reason = "did not say it was listening within {:g} s".format(timeout) if not started else \
            f"exited with status {status} before listening"
        raise ServerStartError(f"switchboard {reason}\ncommand: {' '.join(command)}\nlog:\n{''.join(log) or '(empty)'}")
    host, port = found["plain"]
    return SwitchboardServer(host=host, port=port, tls_port=found["tls"][1] if wants_tls else None,
                             token=_option(args, "--token"), args=args, process=process, _log=log, _log_reader=reader)


class ServerFactory:
    """Starts servers for one test and stops them all after it, checking each exits with status 0."""

    def __init__(self) -> None:
        self.servers: List[SwitchboardServer] = []

    def __call__(self, *args: Any, timeout: float = 60.0, env: Optional[Dict[str, str]] = None) -> SwitchboardServer:
        server = start_server(list(args), timeout=timeout, env=env)
        self.servers.append(server)
        return server

    def stop_all(self) -> List[str]:
        """Stops every server; returns a complaint per server that did not exit with status 0."""
        complaints = []
        for server in self.servers:
            status = server.stop()
            if status != 0:
                complaints.append(f"switchboard (pid {server.pid}, args {server.args}) exited with status {status} "
                                  f"on SIGTERM, not 0\nlog:\n{server.log}")
        return complaints


@pytest.fixture
def switchboard_server_factory():
    """``start(*args)``: a new server with these ``switchboard serve`` options; all stopped after the test."""
    factory = ServerFactory()
    yield factory
    complaints = factory.stop_all()
    if complaints:
        pytest.fail("\n".join(complaints), pytrace=False)


@pytest.fixture
def switchboard_server(request, switchboard_server_factory):
    """A fresh server for this test, with the options of its ``@pytest.mark.switchboard(...)`` marker."""
    marker = request.node.get_closest_marker("switchboard")
    args = list(marker.args) if marker else []
    try:
        return switchboard_server_factory(*args)
    except ServerStartError as error:
        pytest.fail(str(error), pytrace=False)


class _ClientToConnect:
    """What ``switchboard_client`` is until the async test starts: connected in the test's own event loop."""

    def __init__(self, server: SwitchboardServer, options: Dict[str, Any]) -> None:
        self.server = server
        self.options = options

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("switchboard_client is a connected client only in an `async def` test that this plugin "
                           "runs; with pytest-asyncio, connect in the test: `await switchboard_server.connect()`")


@pytest.fixture
def switchboard_client(request, switchboard_server):
    """A client connected to ``switchboard_server`` (with its ``--token``), in an ``async def`` test, with the
    :func:`switchboard.connect` options of its ``@pytest.mark.switchboard_client(...)`` marker."""
    marker = request.node.get_closest_marker("switchboard_client")
    return _ClientToConnect(switchboard_server, dict(marker.kwargs) if marker else {})


@pytest.fixture
def switchboard_cut_seed():
    """A seed for a cutting proxy: ``$SWITCHBOARD_CUT_SEED``, else a random one; printed, so a failure shows it."""
    configured = os.environ.get("SWITCHBOARD_CUT_SEED")
    seed = int(configured) if configured else random.randrange(1 << 32)
    print(f"cutting proxy seed {seed} (SWITCHBOARD_CUT_SEED={seed} repeats it)")
    return seed


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "switchboard(*args): options of `switchboard serve` for the "
                                       "switchboard_server fixture, such as \"--token\", \"s3cret\"")
    config.addinivalue_line("markers", "switchboard_client(**options): options of switchboard.connect for the "
                                       "switchboard_client fixture, such as resumable=True")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Runs an ``async def`` test in a fresh event loop, connecting its ``switchboard_client`` there first."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    if any(pyfuncitem.get_closest_marker(name) for name in ("asyncio", "anyio", "trio")):
        return None  # pytest-asyncio, anyio or pytest-trio runs it
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(_run_async_test(pyfuncitem.obj, arguments))
    return True


async def _run_async_test(test: Any, arguments: Dict[str, Any]) -> None:
    clients = []
    try:
        for name, value in arguments.items():
            if isinstance(value, _ClientToConnect):
                client = await value.server.connect(**value.options)
                clients.append(client)
                arguments[name] = client
        await test(**arguments)
    finally:
        for client in clients:
            await client.close()
