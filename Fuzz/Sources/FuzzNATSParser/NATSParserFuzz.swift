import FuzzSupport
import SwitchboardCluster

// Input: one byte seeding the chunk sizes, then what a NATS server might send.
//
// However the stream is cut into reads, NATSParser must give the same operations, and stop at the same
// protocol error if any: what it parses cannot depend on timing. It must stay within its bounds (no
// message over maxPayload; what it buffers without a whole control line stays under the control-line
// limit plus one payload) and never crash on any input.

enum Outcome: Equatable {
    case operation(NATSInbound)
    case failed(NATSProtocolError)
}

let maxControlLine = 256, maxPayload = 1024

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let seed = input.takeByte()
    let stream = input.rest
    let whole = parse([stream])
    let chunked = parse(chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)))
    check(whole == chunked, "whole: \(whole), chunked: \(chunked)")
    return 0
}

func parse(_ pieces: [[UInt8]]) -> [Outcome] {
    var parser = NATSParser(maxControlLine: maxControlLine, maxPayload: maxPayload)
    var outcomes: [Outcome] = []
    for piece in pieces {
        parser.feed(piece)
        do {
            while let operation = try parser.next() {
                if case .message(_, let message) = operation {
                    check(message.payload.count <= maxPayload, "a payload of \(message.payload.count) bytes")
                }
                outcomes.append(.operation(operation))
            }
        } catch {
            outcomes.append(.failed(error))
            return outcomes
        }
        // At most a control line without its end, or a whole one and a payload short of its end.
        check(parser.bufferedBytes <= maxControlLine + 2 + maxPayload + 2, "\(parser.bufferedBytes) bytes buffered")
    }
    return outcomes
}
