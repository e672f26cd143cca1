import Testing
@testable import BearerdProxy
@Test func EndToEndTestsBuilds() { #expect(Bool(true)) }
