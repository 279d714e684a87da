import Testing
@testable import SwitchboardCodec

struct Point: StandardCustomValue {
    static let typeByte: UInt8 = 128
    var x: Double
    var y: Double

    func write(to writer: inout StandardWriter) throws(CodecError) {
        try writer.writeValue(.float64(x))
        try writer.writeValue(.float64(y))
    }

    static func read(from reader: inout StandardReader) throws(CodecError) -> Point {
        Point(x: try reader.readDouble(), y: try reader.readDouble())
    }
}

@Suite struct CustomTypes {
    let codec = StandardMessageCodec(customTypes: [Point.self])

    @Test func customValueInsideAList() throws {
        let value: ChannelValue = [.custom(Point(x: 1, y: 2)), "after"]
        let bytes = try codec.encode(value)!
        // 0c 02 | 80 | 06 pad(4) 1.0 | 06 pad(7) 2.0 | 07 05 after
        #expect(bytes == hex("0c 02 80 06 00000000 000000000000f03f 06 00000000000000 0000000000000040 07 05 6166746572"))
        #expect(try codec.decode(bytes) == value)
        #expect(throws: CodecError.self) { try StandardMessageCodec().decode(bytes) }
        #expect(ChannelValue.custom(Point(x: 1, y: 2)) != .custom(Point(x: 1, y: 3)))
    }
}

struct Reading: Codable, Equatable {
    var sensor: String
    var values: [Double]
    var raw: [UInt8]
    var count: Int
    var big: Int64
    var note: String?
    var nested: [String: Int]
}

@Suite struct CodableBridge {
    @Test func roundTripsThroughStandardBytes() throws {
        let reading = Reading(sensor: "imu", values: [1.5, -2], raw: [1, 2, 3], count: 7, big: 1 << 40,
                              note: nil, nested: ["a": 1])
        let value = try ChannelValueEncoder().encode(reading)
        #expect(value["sensor"] == "imu")
        #expect(value["raw"] == .uint8List([1, 2, 3]))
        #expect(value["count"] == .int32(7))
        #expect(value["big"] == .int64(1 << 40))
        #expect(value["note"] == nil)
        let bytes = try StandardMessageCodec().encode(value)
        let back = try ChannelValueDecoder().decode(Reading.self, from: StandardMessageCodec().decode(bytes))
        #expect(back == reading)
    }

    @Test func decodingErrors() {
        #expect(throws: DecodingError.self) { try ChannelValueDecoder().decode(Int8.self, from: 300) }
        #expect(throws: DecodingError.self) { try ChannelValueDecoder().decode(String.self, from: 1) }
        #expect(throws: DecodingError.self) { try ChannelValueDecoder().decode(Reading.self, from: ["sensor": "x"]) }
        #expect(throws: (any Error).self) { try ChannelValueEncoder().encode(UInt64.max) }
    }

    @Test func typedListsDecodeAsArrays() throws {
        #expect(try ChannelValueDecoder().decode([Int].self, from: .int32List([1, 2])) == [1, 2])
        #expect(try ChannelValueDecoder().decode([Double].self, from: .float64List([0.5])) == [0.5])
    }
}
