import CLibUV

/// A libuv call that failed: its error code and what was being done.
public struct UVError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The negative libuv error code.
    public let code: Int32
    /// The libuv function that failed.
    public let operation: String

    /// Makes an error.
    public init(code: Int32, operation: String) {
        self.code = code
        self.operation = operation
    }

    /// libuv's name for the code, such as `EADDRINUSE`.
    public var name: String { String(cString: uv_err_name(code)) }

    public var description: String { "\(operation): \(String(cString: uv_strerror(code))) (\(name))" }

    /// Throws a `UVError` for a negative return code.
    static func check(_ rc: Int32, _ operation: String) throws(UVError) {
        if rc < 0 { throw UVError(code: rc, operation: operation) }
    }
}
