import Testing
@testable import BearerdHTTP
@Test func BearerdHTTPTestsBuilds() { #expect(Bool(true)) }
