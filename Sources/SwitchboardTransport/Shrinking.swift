/// Removal that gives a table's room back. A Swift `Dictionary` or `Set` never shrinks its storage by
/// itself: a table that once held an entry per channel of a registration flood (40,000 channels) keeps
/// its slots, megabytes of them, after every channel is gone. These removals move what is left into
/// storage of twice its size once it fills an eighth of its room or less. That costs the entries left,
/// paid for by the removals that emptied the room so far, so a removal stays O(1) on average; tables of
/// less than ``shrinkableRoom`` slots are left as they are.
package let shrinkableRoom = 1024  // 24 KiB of slots for a table of strings

extension Dictionary {
    /// Removes and returns the value for `key`, as `removeValue(forKey:)`, then shrinks the storage if
    /// what is left fills an eighth of it or less.
    @discardableResult
    package mutating func removeValueShrinking(forKey key: Key) -> Value? {
        guard let value = removeValue(forKey: key) else { return nil }
        if capacity >= shrinkableRoom, count <= capacity / 8 {
            var smaller = Self(minimumCapacity: count * 2)
            for (key, value) in self { smaller[key] = value }
            self = smaller
        }
        return value
    }
}

extension Set {
    /// Removes `member`, as `remove(_:)`, then shrinks the storage if what is left fills an eighth of it
    /// or less.
    @discardableResult
    package mutating func removeShrinking(_ member: Element) -> Element? {
        guard let removed = remove(member) else { return nil }
        if capacity >= shrinkableRoom, count <= capacity / 8 {
            var smaller = Self(minimumCapacity: count * 2)  // not Set(self): that takes the same storage
            for member in self { smaller.insert(member) }
            self = smaller
        }
        return removed
    }
}
