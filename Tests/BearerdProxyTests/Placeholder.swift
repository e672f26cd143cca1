import Testing
@testable import BearerdProxy
@Test func BearerdProxyTestsBuilds() { #expect(Bool(true)) }
