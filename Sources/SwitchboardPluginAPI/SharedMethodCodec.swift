import SwitchboardCodec

/// A method codec behind one reference, so that every request on a channel shares it: passing a
/// reference costs a retain, copying the existential costs several runtime calls. The server's channels
/// and an ``InboundRequest`` hold the same one.
package final class SharedMethodCodec {
    package let codec: any MethodCodec
    package init(_ codec: any MethodCodec) { self.codec = codec }
}
