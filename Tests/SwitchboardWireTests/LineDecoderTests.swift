import Testing
import SwitchboardWire

/// `LineDecoder` against wire-v1 section 5: lines end with `\n`, `\r\n` is accepted, blank lines reach the
/// caller (text mode ignores them), and a line over the limit is reported once and skipped unbuffered.
@Suite struct LineDecoderTests {
    static let tooLong = "⟨too long⟩"

    @Test("split in two at every byte offset, LF and CRLF lines decode to the same lines, without their endings")
    func everySplit() {
        let text = Array("{\"id\":1}\r\n{\"b\":\"x\ry\"}\n\n\r\n{}".utf8) + Array("\n".utf8)
        for offset in 0...text.count {
            var decoder = LineDecoder(maxLine: 100)
            var buffer = InboundBuffer()
            buffer.append(Array(text[..<offset]))
            var lines = decodeAll(&decoder, &buffer)
            buffer.append(Array(text[offset...]))
            lines += decodeAll(&decoder, &buffer)
            #expect(lines == ["{\"id\":1}", "{\"b\":\"x\ry\"}", "", "", "{}"], "split at \(offset)")
            #expect(buffer.readableBytes == 0)
        }
    }

    @Test("a line without its newline yet is not a line; a lone \\r does not end one")
    func incompleteLine() {
        var decoder = LineDecoder(maxLine: 100)
        var buffer = InboundBuffer()
        buffer.append(Array("{\"a\":1}\r".utf8))
        #expect(decoder.next(from: &buffer) == nil)
        buffer.append(Array("{}\n".utf8))
        #expect(decodeAll(&decoder, &buffer) == ["{\"a\":1}\r{}"])
    }

    @Test("a line of exactly the limit is a line, with LF or CRLF, whole or byte by byte; one byte more is too long",
          arguments: ["\n", "\r\n"], [false, true])
    func limit(ending: String, byteByByte: Bool) {
        let limit = 16
        let exact = String(repeating: "a", count: limit), over = String(repeating: "b", count: limit + 1)
        let text = Array((exact + ending + over + ending + "{}" + ending).utf8)
        var decoder = LineDecoder(maxLine: limit)
        var buffer = InboundBuffer()
        var lines: [String] = []
        for chunk in byteByByte ? text.map { [$0] } : [text] {
            buffer.append(chunk)
            lines += decodeAll(&decoder, &buffer)
        }
        #expect(lines == [exact, Self.tooLong, "{}"])
    }

    @Test("a line over the limit is reported once, as soon as the limit is passed, and its rest is never buffered")
    func overLimitIsSkippedUnbuffered() {
        var decoder = LineDecoder(maxLine: 100)
        var buffer = InboundBuffer()
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 64)
        var lines: [String] = []
        for _ in 0..<1000 {
            buffer.append(chunk)
            lines += decodeAll(&decoder, &buffer)
            #expect(buffer.readableBytes <= 100 + 1)
        }
        #expect(lines == [Self.tooLong] && decoder.isSkippingLine)
        buffer.append(Array("xxx\n{\"id\":2}\n".utf8))
        #expect(decodeAll(&decoder, &buffer) == ["{\"id\":2}"] && !decoder.isSkippingLine)
    }

    @Test("a line over the limit that arrives whole is too long, and the lines around it are not")
    func overLimitInOneRead() {
        var decoder = LineDecoder(maxLine: 4)
        var buffer = InboundBuffer()
        buffer.append(Array("1234\n12345\r\n123\n".utf8))
        #expect(decodeAll(&decoder, &buffer) == ["1234", Self.tooLong, "123"])
    }

    /// Every line `decoder` can take from `buffer` now, as text; a line over the limit as ``tooLong``.
    func decodeAll(_ decoder: inout LineDecoder, _ buffer: inout InboundBuffer) -> [String] {
        var out: [String] = []
        while let decoded = decoder.next(from: &buffer) {
            switch decoded {
            case .line(let line): out.append(String(decoding: line, as: UTF8.self))
            case .tooLong: out.append(Self.tooLong)
            }
        }
        return out
    }
}
