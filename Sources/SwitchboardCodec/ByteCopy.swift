extension Array where Element == UInt8 {
    /// Appends a copy of `bytes`. Unlike `append(contentsOf:)`, which takes its argument owned and so
    /// retains and releases the source's storage (two atomic operations per call), it only borrows it:
    /// on the paths that append one frame per call or per listener, that pair was a tenth of the atomics.
    package mutating func append(copying bytes: borrowing [UInt8]) {
        // Sound: the buffer pointer is used only inside the closure, while `bytes` is borrowed, and
        // `append(contentsOf:)` copies from it before it returns.
        unsafe bytes.withUnsafeBufferPointer { unsafe self.append(contentsOf: $0) }
    }

    /// Appends a copy of `bytes` (a slice of a frame, say), borrowing it as ``append(copying:)-([UInt8])`` does.
    package mutating func append(copying bytes: borrowing ArraySlice<UInt8>) {
        // Sound for the same reason.
        unsafe bytes.withUnsafeBufferPointer { unsafe self.append(contentsOf: $0) }
    }

    /// Appends a copy of the bytes `bytes` views (part of a frame read in place, say): no storage is
    /// retained, as none is referred to.
    package mutating func append(copying bytes: Span<UInt8>) {
        // Sound for the same reason: the span is valid for the whole call.
        unsafe bytes.withUnsafeBufferPointer { unsafe self.append(contentsOf: $0) }
    }
}
