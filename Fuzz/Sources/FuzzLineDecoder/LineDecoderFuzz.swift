import FuzzSupport
import SwitchboardWire

// Input: one byte giving maxLine (0...63), one seeding the chunk sizes, then the text stream.
//
// The lines and too-long reports LineDecoder gives for the chunked stream must be exactly those of a
// plain split on "\n": each line without its ending ("\r\n" or "\n"), at most maxLine bytes, or one
// `.tooLong` for a longer one (whose bytes are skipped), whatever the chunking; what stays buffered is
// the unterminated tail. So lines, endings, skipped bytes and the tail account for every input byte.

enum Event: Equatable {
    case line([UInt8])
    case tooLong
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let maxLine = Int(input.takeByte() % 64)
    let seed = input.takeByte()
    let stream = input.rest

    var decoder = LineDecoder(maxLine: maxLine)
    var buffer = InboundBuffer()
    var events: [Event] = []
    for chunk in chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)) {
        buffer.append(chunk)
        while let decoded = decoder.next(from: &buffer) {
            switch decoded {
            case .line(let line):
                check(line.count <= maxLine, "line of \(line.count) bytes, maxLine \(maxLine)")
                check(!line.contains(UInt8(ascii: "\n")), "line holds a newline: \(hex(line))")
                events.append(.line(Array(line)))
            case .tooLong:
                events.append(.tooLong)
            }
        }
    }
    let expected = split(stream, maxLine: maxLine)
    check(events == expected.events, "maxLine \(maxLine): got \(events), expected \(expected.events)")
    check(buffer.readableBytes == expected.left, "\(buffer.readableBytes) bytes buffered, expected \(expected.left)")
    return 0
}

/// The reference: split on "\n", drop one "\r" before it, report lines over maxLine as too long. An
/// unterminated tail stays buffered until it exceeds maxLine + 1 bytes (a "\r" may still come), then it
/// is reported and skipped.
func split(_ stream: [UInt8], maxLine: Int) -> (events: [Event], left: Int) {
    var pieces = stream.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
    let tail = pieces.removeLast()
    var events: [Event] = pieces.map { piece in
        let line = piece.last == UInt8(ascii: "\r") ? piece.dropLast() : piece
        return line.count <= maxLine ? .line(Array(line)) : .tooLong
    }
    if tail.count > maxLine + 1 {
        events.append(.tooLong)
        return (events, 0)
    }
    return (events, tail.count)
}
