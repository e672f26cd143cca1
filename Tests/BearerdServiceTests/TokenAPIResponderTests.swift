import Testing
import BearerdConfig
@testable import BearerdService

/// The token API's browser guard: which request fields make a request browser-like (docs/architecture.md §4 `token_api:`).
@Suite struct TokenAPIResponderTests {
    @Test func browserFieldsAreRecognised() {
        for n in ["Origin", "origin", "Sec-Fetch-Site", "sec-fetch-mode", "SEC-FETCH-DEST", "Sec-Fetch-User"] {
            #expect(TokenAPIResponder.isBrowserField(n))
        }
        for n in ["Bearerd-Token-Request", "Referer", "Host", "Sec-WebSocket-Key"] {
            #expect(!TokenAPIResponder.isBrowserField(n))
        }
    }

    /// The refusal log: a burst, then silence for the rest of the window, then a line that says
    /// how many were left out.
    @Test func refusalLinesAreRateLimited() {
        var limit = LogRateLimit(interval: 10, burst: 3)
        var written: [(Int, UInt64)] = []
        for t in 0..<25 {
            let r = limit.admit(now: 100 + UInt64(t))
            if r.write { written.append((t, r.leftOut)) }
        }
        // Windows start at t=0, 10, 20: three lines each, the first of a window counting the rest.
        #expect(written.map(\.0) == [0, 1, 2, 10, 11, 12, 20, 21, 22])
        #expect(written.map(\.1) == [0, 0, 0, 7, 0, 0, 7, 0, 0])
        // A clock that steps back opens a new window instead of trapping.
        let back = limit.admit(now: 5)
        #expect(back.write && back.leftOut == 2)
        var one = LogRateLimit(interval: 0, burst: 0)
        #expect(one.interval == 1 && one.burst == 1)
        #expect(one.admit(now: .max).write)
    }

    @Test func onlyListedUidsAreAdmitted() {
        let api = TokenAPIConfig(listen: .unix(path: "/run/t.sock"), sessions: ["a"], allowedUIDs: [1000, 0])
        #expect(TokenAPIResponder.admits(uid: 1000, api))
        #expect(!TokenAPIResponder.admits(uid: 1001, api))
        #expect(!TokenAPIResponder.admits(uid: nil, api), "unreadable credentials: never")
        #expect(!TokenAPIResponder.admits(uid: 1000, nil), "no token_api: nobody")
        let own = TokenAPIConfig(listen: .unix(path: "/run/t.sock"), sessions: ["a"])
        #expect(TokenAPIResponder.admits(uid: 42, own, ownUID: 42), "default: bearerd's own uid")
        #expect(!TokenAPIResponder.admits(uid: 0, own, ownUID: 42))
    }
}
