/// A bounded write cursor over temporary memory: what the head serialisers write through before
/// one copy into a connection's output (per-byte `Array.append` checks uniqueness and capacity
/// at every byte, and appending a `String.UTF8View` goes through a generic copy; measured, bench/RESULTS.md).
/// Value type, used within one call. Invariant: `p <= end`; a write that does not fit is
/// refused and sets `overflowed` (never past `end`), and `appendingHead` then starts over with
/// twice the room, so an estimate that is too small costs time, never bytes or memory safety.
public struct ByteCursor {
    @usableFromInline var p: UnsafeMutablePointer<UInt8>
    @usableFromInline let end: UnsafeMutablePointer<UInt8>
    @usableFromInline var overflowed = false

    @inlinable init(_ block: UnsafeMutableBufferPointer<UInt8>) {
        p = block.baseAddress!  // non-nil: `appendingHead` allocates at least 64 bytes
        end = p + block.count
    }

    @inlinable @inline(__always)
    public mutating func put(_ b: UInt8) {
        guard p < end else {
            overflowed = true
            return
        }
        p.initialize(to: b)
        p += 1
    }

    @inlinable @inline(__always)
    public mutating func put(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard bytes.count <= end - p else {
            overflowed = true
            return
        }
        p.initialize(from: base, count: bytes.count)
        p += bytes.count
    }

    /// The string's UTF-8 bytes (native and small strings are contiguous: one copy).
    @inlinable @inline(__always)
    public mutating func put(_ s: String) {
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { put($0) }
        if done == nil { for b in s.utf8 { put(b) } }
    }

    @inlinable @inline(__always)
    public mutating func put(_ s: Substring) {
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { put($0) }
        if done == nil { for b in s.utf8 { put(b) } }
    }

    @inlinable @inline(__always)
    public mutating func put(_ s: StaticString) {
        put(UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    /// `n` in decimal, without building a `String`.
    @inlinable
    public mutating func putDecimal(_ n: UInt64) {
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: UInt64.max has 20 digits
        withUnsafeMutableBytes(of: &digits) { raw in
            var v = n
            var i = raw.count
            repeat {
                i -= 1
                raw[i] = UInt8(truncatingIfNeeded: 0x30 &+ v % 10)
                v /= 10
            } while v > 0
            put(UnsafeBufferPointer(rebasing: raw.bindMemory(to: UInt8.self)[i...]))
        }
    }

    @inlinable @inline(__always)
    mutating func putCRLF() {
        put(asciiCR)
        put(asciiLF)
    }
}

extension Array where Element == UInt8 {
    /// Appends what `write` puts through a cursor over `estimate` bytes of temporary memory (the
    /// stack for heads of ordinary size), with one copy. If the estimate was short the block is
    /// discarded and `write` runs again with twice the room (`write` must be repeatable: it only
    /// reads its inputs).
    @inlinable
    public mutating func appendingHead(estimate: Int, _ write: (inout ByteCursor) -> Void) {
        var room = Swift.max(64, estimate)
        while true {
            let wrote: Bool = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: room) { block in
                var c = ByteCursor(block)
                write(&c)
                guard !c.overflowed else { return false }
                append(contentsOf: UnsafeBufferPointer(start: block.baseAddress, count: c.p - block.baseAddress!))
                return true
            }
            if wrote { return }
            let (doubled, o) = room.multipliedReportingOverflow(by: 2)
            precondition(!o, "a message head larger than memory")  // unreachable: heads are bounded by the parser's limits
            room = doubled
        }
    }
}
