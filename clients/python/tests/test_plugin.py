"""The pytest plugin itself: it starts a server, the test uses it, it stops it cleanly, and says why when not."""

import json
import os
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

import switchboard
from switchboard import MethodChannel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
README = Path(__file__).resolve().parents[1] / "README.md"


def test_a_server_starts_serves_and_stops_with_status_0(switchboard_server_factory):
    server = switchboard_server_factory()
    assert server.process.poll() is None and server.host == "127.0.0.1" and server.port > 0
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/healthz") as response:
        assert json.load(response)["status"] == "serving"
    assert "listening on" in server.log
    assert server.stop() == 0
    assert server.process.poll() == 0


@pytest.mark.switchboard("--no-demo")
async def test_the_marker_gives_the_server_its_options(switchboard_server, switchboard_client):
    assert switchboard_server.args == ["--no-demo"]
    with pytest.raises(switchboard.MissingPluginException):
        await MethodChannel("switchboard/echo", switchboard_client).invoke_method("echo", 1)


def test_each_test_gets_a_fresh_server(pytester):
    pytester.makepyfile(textwrap.dedent("""
        ports = []

        def test_one(switchboard_server):
            ports.append((switchboard_server.port, switchboard_server.pid))

        def test_two(switchboard_server):
            ports.append((switchboard_server.port, switchboard_server.pid))
            assert ports[0] != ports[1]
    """))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_a_server_that_fails_to_start_is_reported_with_its_status_and_log(pytester):
    pytester.makepyfile(textwrap.dedent("""
        import pytest

        @pytest.mark.switchboard("--config", "/nonexistent/switchboard.json")
        def test_it(switchboard_server):
            pass
    """))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*switchboard exited with status 78 before listening*",
                                 "*command: *serve --port 0 --log-level notice --config /nonexistent/switchboard.json*",
                                 "*invalid configuration*"])


def test_a_missing_binary_is_named(pytester, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD", "/nonexistent/switchboard")
    pytester.makepyfile("def test_it(switchboard_server):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*$SWITCHBOARD is '/nonexistent/switchboard', which is not an executable file*"])


def test_a_server_that_does_not_exit_with_0_fails_the_test_at_teardown(pytester, monkeypatch, tmp_path):
    fake = tmp_path / "fake-switchboard"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import signal, sys
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
        print("notice listening on 127.0.0.1:9 with 1 loops", flush=True)
        signal.pause()
    """))
    fake.chmod(0o755)
    monkeypatch.setenv("SWITCHBOARD", str(fake))
    pytester.makepyfile("def test_it(switchboard_server):\n    assert switchboard_server.port == 9\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*exited with status 3 on SIGTERM, not 0*"])


def test_the_client_fixture_explains_itself_in_a_sync_test(pytester):
    pytester.makepyfile("def test_it(switchboard_client):\n    switchboard_client.close\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*switchboard_client is a connected client only in an `async def` test*"])


def test_the_readme_example_is_the_example_file_and_passes(pytester):
    example = (EXAMPLES / "test_example.py").read_text()
    readme = README.read_text()
    assert f"```python\n{example}```" in readme
    pytester.makepyfile(test_readme_example=example)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=example.count("\nasync def test_"))


def test_the_clients_guide_snippet_passes(pytester):
    guide = (Path(__file__).resolve().parents[3] / "docs" / "clients.md").read_text()
    section = guide.split("## Python, for tests\n", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    pytester.makepyfile(test_clients_guide="import pytest\nimport switchboard\n\n" + snippet)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
