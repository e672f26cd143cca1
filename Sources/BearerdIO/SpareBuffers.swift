/// Emptied output buffers of the loop's connections, kept for their next writes: a channel
/// takes one when it has output to queue and gives it back once everything is written, so an
/// idle connection holds none (nginx frees a keep-alive connection's buffers the same way), and
/// a new connection's first write neither grows an empty array step by step nor frees at close.
/// Owned by one `EventLoop` and touched only on its queue.
///
/// Invariants: every kept buffer is empty (`count == 0`), so no byte of one connection is ever
/// readable through another's buffer; its capacity lies within
/// `minimumCapacity...maximumCapacity`; at most `maximumKept` are kept (together at most
/// `maximumKept * maximumCapacity` bytes per loop, the bound on what idle memory this costs).
public struct SpareBuffers {
    /// Buffers kept at most: as many as one event usually flushes (a burst beyond frees the
    /// rest).
    public static let maximumKept = 64
    /// Larger buffers (a connection that relayed big bodies) are freed, not kept.
    public static let maximumCapacity = 32 * 1024
    /// Smaller ones are not worth keeping: they would grow again at once.
    public static let minimumCapacity = 1024
    /// What a buffer handed out when none is kept can hold before it grows: a request or
    /// response head and a small body without a reallocation.
    public static let initialCapacity = 4096

    private var kept: [[UInt8]] = []

    public init() {}

    /// How many buffers are kept now.
    public var count: Int { kept.count }

    /// An empty buffer with room for at least `initialCapacity` bytes: a kept one, or a new one.
    public mutating func take() -> [UInt8] {
        if let spare = kept.popLast() { return spare }
        var fresh: [UInt8] = []
        fresh.reserveCapacity(Self.initialCapacity)
        return fresh
    }

    /// Takes `buffer` back (leaving an empty array without storage in its place): emptied and
    /// kept if its capacity is worth keeping and there is room, else freed.
    public mutating func giveBack(_ buffer: inout [UInt8]) {
        var returned: [UInt8] = []
        swap(&returned, &buffer)
        let capacity = returned.capacity
        guard kept.count < Self.maximumKept,
              capacity >= Self.minimumCapacity, capacity <= Self.maximumCapacity else { return }
        // Keeps the storage when this is its only reference (a copy still shared with
        // someone gets a fresh storage of the same capacity instead: never the shared one).
        if !returned.isEmpty { returned.removeAll(keepingCapacity: true) }
        kept.append(returned)
    }
}
