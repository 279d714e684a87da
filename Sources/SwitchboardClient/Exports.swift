// A client needs only `import SwitchboardClient`: the values, errors and codecs its API takes and
// returns come with it (`ChannelValue`, `ChannelError`, `MethodCall`, `StandardMethodCodec`,
// `StringCodec`, `BinaryCodec`, the JSON codecs; the codec module has no I/O, so nothing else comes
// along), and from the transport module only what `ClientConfiguration.tls` takes.
@_exported import SwitchboardCodec
@_exported import class SwitchboardTransport.TLSContext
@_exported import struct SwitchboardTransport.TLSError
