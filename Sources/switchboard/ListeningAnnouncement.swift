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
        guard let portFile else { return }
        guard let (probe, name) = Self.makeTemporary(beside: portFile) else { Self.failToWrite(portFile) }
        close(probe)
        unlink(name)
        withdraw()
    }

    /// A new file to write the port file under, then rename: a reader never sees half of it. Its name
    /// (`PATH.XXXXXX`) is random and made exclusively (mkstemp: O_CREAT | O_EXCL), so that another user
    /// of a shared directory such as /tmp cannot have a symlink or a file of theirs there first; nil if
    /// it cannot be made.
    private static func makeTemporary(beside path: String) -> (descriptor: Int32, name: String)? {
        var template = Array("\(path).XXXXXX".utf8CString)
        let descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard descriptor >= 0 else { return nil }
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)  // Glibc's module has no mkostemp
        return (descriptor, String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }

    /// Writes the lines and the port file; once `server` listens.
    func announce(_ server: Server) {
        let address = host.contains(":") ? "[\(host)]" : host
        var lines = "switchboard: listening on \(address):\(server.port)\n"
        if server.tlsPort != 0 { lines += "switchboard: listening for TLS on \(address):\(server.tlsPort)\n" }
        writeAll(lines, to: 1)
        guard let portFile else { return }
        let text = "\(server.port)\n" + (server.tlsPort != 0 ? "\(server.tlsPort)\n" : "")
        guard let (file, temporary) = Self.makeTemporary(beside: portFile) else { Self.failToWrite(portFile) }
        let written = fchmod(file, 0o644) == 0 && writeAll(text, to: file)
        close(file)
        guard written, rename(temporary, portFile) == 0 else {
            let error = errno
            unlink(temporary)
            errno = error
            Self.failToWrite(portFile)
        }
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
