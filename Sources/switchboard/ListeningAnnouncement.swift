import ArgumentParser
import Synchronization
import SwitchboardServer
#if canImport(Glibc)
import Glibc
#endif

/// How a script or a test that started `serve --port 0` learns the ports: the "listening" lines on
/// standard output, written whatever the log level, and with `--port-file`, a file holding the port
/// (and the TLS port on a second line) that appears whole once the server listens.
final class ListeningAnnouncement: Sendable {
    let host: String
    let portFile: String?
    /// Why the port file could not be written once the server listened (it is then shut down).
    private let failure = Mutex<String?>(nil)

    /// Checks that the port file can be written before anything listens (a script waiting for it would
    /// otherwise wait forever), and removes one left by an earlier run.
    init(host: String, portFile: String?) throws(ExitCode) {
        self.host = host
        self.portFile = portFile
        guard let portFile else { return }
        var status = stat()
        if stat(portFile, &status) == 0, status.st_mode & S_IFMT == S_IFDIR { throw Self.cannotWrite(portFile, EISDIR) }
        let probe = createTemporary()
        guard probe >= 0 else { throw Self.cannotWrite(portFile, errno) }
        close(probe)
        unlink(temporary)
        withdraw()
    }

    /// The port file is written under this name, then renamed: a reader never sees half of it.
    private var temporary: String { "\(portFile ?? "").\(getpid()).tmp" }

    /// Creates the temporary file afresh: never through a link or a file someone else put there (the
    /// directory may be shared, as /tmp is).
    private func createTemporary() -> Int32 {
        unlink(temporary)
        return open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
    }

    /// Writes the port file, then the lines (so that a reader of the lines finds the file), once
    /// `server` listens; if the file cannot be written, the server is shut down, and ``check()`` says why.
    func announce(_ server: Server) {
        if let portFile {
            let text = "\(server.port)\n" + (server.tlsPort != 0 ? "\(server.tlsPort)\n" : "")
            let file = createTemporary()
            var written = file >= 0 && writeAll(text, to: file)
            var error = errno
            if file >= 0 { close(file) }
            if written, rename(temporary, portFile) != 0 { (written, error) = (false, errno) }
            guard written else {
                unlink(temporary)
                failure.withLock { $0 = Self.describe(portFile, error) }
                return server.shutdown()
            }
        }
        let address = host.contains(":") ? "[\(host)]" : host
        var lines = "switchboard: listening on \(address):\(server.port)\n"
        if server.tlsPort != 0 { lines += "switchboard: listening for TLS on \(address):\(server.tlsPort)\n" }
        writeAll(lines, to: 1)
    }

    /// Throws EX_CANTCREAT if the port file could not be written once the server listened.
    func check() throws(ExitCode) {
        guard let message = failure.withLock({ $0 }) else { return }
        printError(message)
        throw ExitCode(73)
    }

    /// Removes the port file: the server has stopped (or not started).
    func withdraw() {
        if let portFile { unlink(portFile) }
    }

    private static func describe(_ path: String, _ error: Int32) -> String {
        "switchboard: cannot write --port-file \(path): \(String(cString: strerror(error)))\n"
    }

    /// Says why the port file cannot be written; EX_CANTCREAT.
    private static func cannotWrite(_ path: String, _ error: Int32) -> ExitCode {
        printError(describe(path, error))
        return ExitCode(73)
    }
}
