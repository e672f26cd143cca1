import Testing
@testable import BearerdOAuth

/// `CivilTime`, the one UTC calendar conversion: the two directions are inverse over every day
/// from year 0000 to 9999 (sampled), and the clamps hold.
@Suite struct CivilTimeTests {
    @Test func bothDirectionsAgreeFromYearZeroToNineThousandNineHundredNinetyNine() {
        var t = CivilTime.firstSecond
        while t <= CivilTime.lastSecond {
            let c = CivilTime(epochSeconds: t)
            let back = CivilTime.daysFromCivil(year: Int64(c.year), month: Int64(c.month), day: Int64(c.day)) * 86_400 + Int64(c.secondOfDay)
            #expect(back == t, "\(t) → \(c)")
            t += 86_400 * 37 + 3_661  // about 98,700 samples, every time of day and month
        }
    }

    @Test func formsAndClamps() {
        #expect(CivilTime(epochSeconds: 1_440_938_160).iso8601Basic == "20150830T123600Z")
        #expect(CivilTime(epochSeconds: 951_782_400).rfc3339 == "2000-02-29T00:00:00Z")
        #expect(CivilTime(epochSeconds: -1).rfc3339 == "1969-12-31T23:59:59Z")
        #expect(CivilTime(epochSeconds: .min).rfc3339 == "0000-01-01T00:00:00Z")
        #expect(CivilTime(epochSeconds: .max).rfc3339 == "9999-12-31T23:59:59Z")
        #expect(CivilTime(epochSeconds: .min, earliest: TokenFormat.earliestRenderable).rfc3339 == "0001-01-01T00:00:00Z")
    }
}
