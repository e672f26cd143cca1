// The client-connection budget: the pure decisions (`DescriptorBudget`, no sockets), then the
// listener shell under a small budget with real sockets on 127.0.0.1, in both I/O modes.

import Testing
import Foundation
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("Descriptor budget")
struct DescriptorBudgetTests {
    @Test func theBudgetIsHalfOfWhatTheLimitLeavesAfterTheReserve() {
        // 64 descriptors, 12 open at start, a reserve of 20: (64 - 12 - 20) / 2 = 16 clients.
        #expect(DescriptorBudget(limit: 64, inUse: 12, reserve: 20).connections == 16)
        #expect(DescriptorBudget(limit: 1024, inUse: 30, reserve: 26).connections == 484)
        // A limit too low for the reserve still serves one client at a time.
        #expect(DescriptorBudget(limit: 16, inUse: 12, reserve: 20).connections == 1)
        #expect(DescriptorBudget(limit: 0, inUse: 0, reserve: 0).connections == 1)
        // Outside values never trap.
        #expect(DescriptorBudget(limit: Int.max, inUse: -5, reserve: Int.min).connections == Int.max / 2)
        #expect(DescriptorBudget(limit: -1, inUse: Int.max, reserve: Int.max).connections == 1)
        #expect(DescriptorBudget().connections == Int.max, "unconfigured: unlimited")
        #expect(DescriptorBudget.reserve(sessions: 2, listeners: 3) == 16 + 8 + 6)
        #expect(DescriptorBudget.reserve(sessions: Int.max, listeners: -4) == 16 + 4 * (1 << 20))
    }

    @Test func admitsUpToTheBudgetThenPausesUntilAConnectionCloses() {
        var b = DescriptorBudget(limit: 20, inUse: 0, reserve: 14)  // 3 connections
        #expect(b.connections == 3)
        for _ in 0..<3 {
            let v = b.admit()
            #expect(v == .accept)
        }
        #expect(b.open == 3)
        let v2 = b.admit()
        #expect(v2 == .pause(startsStreak: true))
        #expect(b.paused)
        // Another listener asking while paused: refused too, the streak already logged.
        let v3 = b.admit()
        #expect(v3 == .pause(startsStreak: false))
        #expect(b.refusals == 2)
        #expect(b.open == 3, "a refusal holds no slot")
        let r = b.release()
        #expect(r.resume)
        #expect(!b.paused)
        let v4 = b.admit()
        #expect(v4 == .accept)
        #expect(b.open == 3)
    }

    @Test func aBudgetFlappingByOneConnectionLogsOneStreak() {
        var b = DescriptorBudget(limit: 40, inUse: 0, reserve: 0)  // 20; low water 18
        #expect(b.connections == 20)
        #expect(b.lowWater == 18)
        #expect(DescriptorBudget(limit: 4, inUse: 0, reserve: 0).lowWater == 0)
        #expect(DescriptorBudget(limit: 2, inUse: 0, reserve: 0).lowWater == 0)
        #expect(DescriptorBudget(limit: 200, inUse: 0, reserve: 0).lowWater == 90)
        for _ in 0..<20 { _ = b.admit() }
        var starts = 0
        var ends = 0
        // At the budget, one connection closing and one more arriving, many times.
        for _ in 0..<50 {
            if case .pause(true) = b.admit() { starts += 1 }
            let r = b.release()
            #expect(r.resume)
            if r.endsStreak { ends += 1 }
            let v5 = b.admit()
            #expect(v5 == .accept)
        }
        #expect(starts == 1, "one line for the whole streak")
        #expect(ends == 0, "never below the low water mark")
        #expect(b.refusals == 50)
        #expect(b.streakRefusals == 50)
        // Falling to the low water mark ends it, once.
        let v6 = b.release()
        #expect(!v6.endsStreak)
        let v7 = b.release()
        #expect(v7.endsStreak)
        #expect(!b.inStreak)
        let v8 = b.release()
        #expect(!v8.endsStreak)
        // The next refusal starts a new streak.
        for _ in 0..<3 {
            let v = b.admit()
            #expect(v == .accept)
        }
        let v10 = b.admit()
        #expect(v10 == .pause(startsStreak: true))
        #expect(b.streakRefusals == 1)
    }

    @Test func anUnusedSlotIsGivenBackAndReleasesNeverGoNegative() {
        var b = DescriptorBudget(limit: 4, inUse: 0, reserve: 0)  // 2
        let v11 = b.admit()
        #expect(v11 == .accept)
        _ = b.cancel()
        #expect(b.open == 0)
        _ = b.release()
        _ = b.release()
        #expect(b.open == 0)
        let v12 = b.admit()
        #expect(v12 == .accept)
        let v13 = b.admit()
        #expect(v13 == .accept)
        let v14 = b.admit()
        #expect(v14 == .pause(startsStreak: true))
    }

    @Test func aLargerBudgetResumesAPausedListener() {
        var b = DescriptorBudget(limit: 4, inUse: 0, reserve: 0)  // 2
        _ = b.admit()
        _ = b.admit()
        let v15 = b.admit()
        #expect(v15 == .pause(startsStreak: true))
        let v16 = b.configure(limit: 4, inUse: 0, reserve: 0)
        #expect(!v16, "still no room")
        let v17 = b.configure(limit: 8, inUse: 0, reserve: 0)
        #expect(v17, "room: resume")
        #expect(!b.paused)
        #expect(b.open == 2, "open connections stay counted")
    }

    @Test func outOfDescriptorsIsLoggedOncePerStreak() {
        var b = DescriptorBudget()
        let v18 = b.ranOutOfDescriptors()
        #expect(v18)
        let v19 = b.ranOutOfDescriptors()
        #expect(!v19)
        b.accepted()
        let v20 = b.ranOutOfDescriptors()
        #expect(v20)
        #expect(b.outOfDescriptors == 3)
    }
}

/// Events the budget reported, for the shell test.
final class BudgetEvents: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var list: [AcceptBudget.Event] = []
    func add(_ e: AcceptBudget.Event) { lock.withLock { list.append(e) } }
    var paused: Int { lock.withLock { list.filter { if case .pausedAtBudget = $0 { true } else { false } }.count } }
    var ended: Int { lock.withLock { list.filter { if case .streakEnded = $0 { true } else { false } }.count } }
}

@Suite("Listener under a connection budget", .serialized)
struct ListenerBudgetTests {
    static func waitFor(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(10_000)
        }
        return condition()
    }

    /// A budget of 2: two clients are accepted, the rest wait in the backlog (not refused, not
    /// failed); closing an accepted one lets exactly one more in; closing all lets all in.
    @Test(arguments: [EventLoop.IOMode.loopPoller, .socketSources])
    func acceptingPausesAtTheBudgetAndResumesWhenAConnectionCloses(mode: EventLoop.IOMode) throws {
        let group = EventLoopGroup(count: 1, ioMode: mode)
        let budget = AcceptBudget()
        let events = BudgetEvents()
        budget.events = { events.add($0) }
        budget.configure(limit: 4, inUse: 0, reserve: 0)  // 2 connections
        let accepted = AcceptLog()
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: group, budget: budget) { fd, _, _ in accepted.add(fd) }
        defer { l.stop() }
        var clients: [Int32] = []
        defer { for c in clients { close(c) } }
        for _ in 0..<5 {
            let c = socket(AF_INET, linuxSockStream, 0)
            #expect(l.localAddress.withSockAddr { connect(c, $0, $1) } == 0)
            #expect(send(c, "GET / HTTP/1.1\r\n", 16, 0) == 16)  // past TCP_DEFER_ACCEPT
            clients.append(c)
        }
        #expect(Self.waitFor { accepted.fds.count == 2 })
        usleep(200_000)
        #expect(accepted.fds.count == 2, "the budget holds: the others wait in the backlog")
        #expect(budget.snapshot.paused)
        #expect(budget.snapshot.open == 2)
        #expect(budget.snapshot.pausesAtBudget >= 1)
        #expect(events.paused == 1)

        // One accepted connection's descriptor is closed: one more comes in, no more.
        close(accepted.fds[0])
        budget.release()
        #expect(Self.waitFor { accepted.fds.count == 3 })
        usleep(200_000)
        #expect(accepted.fds.count == 3)
        #expect(events.paused == 1, "still the same streak: logged once")

        close(accepted.fds[1])
        budget.release()
        #expect(Self.waitFor { accepted.fds.count == 4 })
        close(accepted.fds[2])
        budget.release()
        #expect(Self.waitFor { accepted.fds.count == 5 })
        #expect(events.paused == 1)
        #expect(events.ended == 0, "never below the low water mark (0 for a budget of 2)")
        #expect(budget.snapshot.open == 2)
        for fd in accepted.fds.suffix(2) {
            close(fd)
            budget.release()
        }
        #expect(Self.waitFor { budget.snapshot.open == 0 })
        #expect(events.ended == 1)
        #expect(budget.snapshot.outOfDescriptors == 0)
    }

    /// A listener paused at the budget can be stopped (a reload removing it): no suspended
    /// source is released (libdispatch traps on that) and its descriptor is closed.
    @Test(arguments: [EventLoop.IOMode.loopPoller, .socketSources])
    func stoppingAListenerPausedAtTheBudget(mode: EventLoop.IOMode) throws {
        let group = EventLoopGroup(count: 1, ioMode: mode)
        let budget = AcceptBudget()
        budget.configure(limit: 2, inUse: 0, reserve: 0)  // 1 connection
        let accepted = AcceptLog()
        var l: Listener? = try Listener.bind(host: "127.0.0.1", port: 0, group: group, budget: budget) { fd, _, _ in accepted.add(fd) }
        let address = try #require(l?.localAddress)
        var clients: [Int32] = []
        defer { for c in clients { close(c) } }
        for _ in 0..<3 {
            let c = socket(AF_INET, linuxSockStream, 0)
            #expect(address.withSockAddr { connect(c, $0, $1) } == 0)
            #expect(send(c, "x", 1, 0) == 1)
            clients.append(c)
        }
        #expect(Self.waitFor { budget.snapshot.paused })
        #expect(group.loops[0].queue.sync { l?.acceptState } == .pausedAtBudget)
        l?.stop()
        #expect(Self.waitFor { group.loops[0].queue.sync { l?.acceptState } == .stopped })
        l = nil
        for fd in accepted.fds { close(fd); budget.release() }
        usleep(100_000)
        #expect(accepted.fds.count == 1, "a stopped listener accepts nothing, even with room again")
        // Its port no longer listens.
        #expect(Self.waitFor {
            let probe = socket(AF_INET, linuxSockStream, 0)
            defer { close(probe) }
            return address.withSockAddr { connect(probe, $0, $1) } != 0
        })
    }
}
