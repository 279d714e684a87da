#if canImport(Glibc)
import Glibc
#endif
import SwitchboardServer

extension ServerConfiguration {
    /// The loops a test's listening server runs: `SWITCHBOARD_TEST_LOOPS` (scripts/test runs the suites
    /// with 1 and with 4), 1 without it. A driven server (``EmbeddedServer``) always runs one.
    public static var testLoops: Int {
        guard let text = getenv("SWITCHBOARD_TEST_LOOPS").map({ String(cString: $0) }), let loops = Int(text), loops >= 1 else { return 1 }
        return loops
    }

    /// A configuration for a test's listening server: any free port, ``testLoops`` loops.
    public static func forTests() -> ServerConfiguration {
        var config = ServerConfiguration()
        config.port = 0
        config.loops = testLoops
        return config
    }
}
