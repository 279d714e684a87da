import SwitchboardServer
#if canImport(Glibc)
import Glibc
#endif

/// How a script or a test that started `serve --port 0` learns the ports: the "listening" lines on
/// standard output, written whatever the log level, and with `--port-file`, a file holding the port
/// (and the TLS port on a second line) that appears whole once the server listens.
struct ListeningAnnouncement: Sendable {
    let host: String
    let portFile: String?

    /// Checks that the port file can be written before anything listens (a script waiting for it would
    /// otherwise wait forever), and removes one left by an earlier run.
    init(host: String, portFile: String?) {
        self.host = host
        self.portFile = portFile
        guard portFile != nil else { return }
        let probe = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard probe >= 0 else { Self.failToWrite(portFile ?? "") }
        close(probe)
        unlink(temporary)
        withdraw()
    }

    /// The port file is written under this name, then renamed: a reader never sees half of it.
    private var temporary: String { "\(portFile ?? "").\(getpid()).tmp" }

    /// Writes the lines and the port file; once `server` listens.
    func announce(_ server: Server) {
        let address = host.contains(":") ? "[\(host)]" : host
        var lines = "switchboard: listening on \(address):\(server.port)\n"
        if server.tlsPort != 0 { lines += "switchboard: listening for TLS on \(address):\(server.tlsPort)\n" }
        writeAll(lines, to: 1)
        guard let portFile else { return }
        let text = "\(server.port)\n" + (server.tlsPort != 0 ? "\(server.tlsPort)\n" : "")
        let file = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        let written = file >= 0 && writeAll(text, to: file)
        if file >= 0 { close(file) }
        guard written, rename(temporary, portFile) == 0 else { Self.failToWrite(portFile) }
    }

    /// Removes the port file: the server has stopped (or not started).
    func withdraw() {
        if let portFile { unlink(portFile) }
    }

    /// Says why the port file cannot be written, and exits with EX_CANTCREAT.
    private static func failToWrite(_ path: String) -> Never {
        printError("switchboard: cannot write --port-file \(path): \(String(cString: strerror(errno)))\n")
        exit(73)
    }
}
