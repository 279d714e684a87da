import Logging

/// A log handler that writes through another with the control characters of every message and metadata
/// value escaped, so that no value a client chose (a channel name, a method, a HELLO's client name, a
/// certificate subject) can end a log line and forge the next, or send a terminal escape sequence.
/// `\n`, `\r` and `\t` are written as such, a backslash as `\\`, and the other C0 and C1 controls,
/// U+2028, U+2029 and the bidirectional overrides as `\u{XX}`. A metadata value that holds a space, `=`
/// or `"` is also put in double quotes, its `"` written as `\"`, so that a reader of `key=value` fields
/// cannot be made to see a field the value only contains (a method `echo user=ops`).
/// `switchboard serve` wraps every log handler in it; an application that embeds the server wraps its
/// own the same way (`LoggingSystem.bootstrap { EscapingLogHandler(StreamLogHandler.standardError(label: $0)) }`).
public struct EscapingLogHandler: LogHandler {
    /// The handler that formats and writes.
    public var inner: any LogHandler

    public init(_ inner: any LogHandler) {
        self.inner = inner
        if let provider = inner.metadataProvider { self.inner.metadataProvider = Self.escaping(provider) }
    }

    public var logLevel: Logger.Level {
        get { inner.logLevel }
        set { inner.logLevel = newValue }
    }

    public var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue.mapValues(Self.escape) }
    }

    public var metadataProvider: Logger.MetadataProvider? {
        get { inner.metadataProvider }
        set { inner.metadataProvider = newValue.map(Self.escaping) }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue.map(Self.escape) }
    }

    public func log(event: LogEvent) {
        var event = event
        let message = event.message.description
        if Self.needsEscaping(message) { event.message = "\(Self.escape(message))" }
        event.metadata = event.metadata?.mapValues(Self.escape)
        if let error = event.error, Self.needsEscaping("\(error)") { event.error = EscapedError(description: Self.escape("\(error)")) }
        inner.log(event: event)
    }

    /// An error, as its escaped description.
    struct EscapedError: Error, CustomStringConvertible {
        let description: String
    }

    /// `provider`, its values escaped.
    static func escaping(_ provider: Logger.MetadataProvider) -> Logger.MetadataProvider {
        Logger.MetadataProvider { provider.get().mapValues(escape) }
    }

    /// `value` with its strings escaped, and quoted if they need it.
    static func escape(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): needsEscaping(text) || needsQuotes(text) ? .string(quote(escape(text))) : value
        case .stringConvertible(let convertible):
            needsEscaping(convertible.description) || needsQuotes(convertible.description)
                ? .string(quote(escape(convertible.description))) : value
        case .dictionary(let metadata): .dictionary(metadata.mapValues(escape))
        case .array(let values): .array(values.map(escape))
        }
    }

    /// `text` with every character ``isEscaped(_:)`` says written out.
    static func escape(_ text: String) -> String {
        guard needsEscaping(text) else { return text }
        var escaped = ""
        escaped.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            guard isEscaped(scalar) else {
                escaped.unicodeScalars.append(scalar)
                continue
            }
            switch scalar {
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case "\\": escaped += "\\\\"
            default: escaped += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            }
        }
        return escaped
    }

    static func needsEscaping(_ text: String) -> Bool { text.unicodeScalars.contains(where: isEscaped) }

    /// Whether a metadata value holds a space, `=` or `"`, which would let it pass for more than one field.
    static func needsQuotes(_ text: String) -> Bool { text.utf8.contains { $0 == 0x20 || $0 == 0x3D || $0 == 0x22 } }

    /// `text` (escaped already) in double quotes with its `"` as `\"`, if it ``needsQuotes(_:)``.
    static func quote(_ text: String) -> String {
        guard needsQuotes(text) else { return text }
        var quoted = "\""
        for scalar in text.unicodeScalars {
            if scalar == "\"" { quoted += "\\" }
            quoted.unicodeScalars.append(scalar)
        }
        return quoted + "\""
    }

    /// C0 and C1 controls, DEL, the backslash, the line and paragraph separators, and the bidirectional
    /// embeddings, overrides and isolates (which reorder what a terminal shows).
    static func isEscaped(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0..<0x20, 0x5C, 0x7F...0x9F, 0x2028...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}
