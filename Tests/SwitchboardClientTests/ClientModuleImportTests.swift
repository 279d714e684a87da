// This file imports SwitchboardClient alone, as the README's client does: what a client names must
// come with it (Sources/SwitchboardClient/Exports.swift).
import SwitchboardClient
import Testing

@Suite struct ClientModuleAlone {
    @Test func namesWhatTheClientAPITakesAndGives() throws {
        let error = ChannelError(code: "c", message: "m", details: ["retryAfterMs": 5])
        #expect(error.details["retryAfterMs"] == 5)
        let codecs: [any MessageCodec] = [StringCodec(), BinaryCodec(), JSONMessageCodec(), StandardMessageCodec()]
        #expect(codecs.count == 4)
        let methodCodecs: [any MethodCodec] = [StandardMethodCodec(), JSONMethodCodec()]
        #expect(try methodCodecs[0].decodeMethodCall(methodCodecs[0].encodeMethodCall(MethodCall(method: "m", arguments: 1))).method == "m")
        var configuration = ClientConfiguration(port: 7421)
        configuration.tls = try TLSContext.client()
        #expect(configuration.tls != nil)
    }
}
