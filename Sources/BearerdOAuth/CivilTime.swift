/// The UTC calendar fields of an instant and back (proleptic Gregorian; H. Hinnant's
/// `civil_from_days` and `days_from_civil`): the one conversion behind every timestamp bearerd
/// writes or reads (RFC 3339 in `bearerd token` and credentials, SigV4's basic form, HTTP dates,
/// log lines). Pure.
///
/// Invariant: the seconds are clamped to years 0000–9999 (and to `earliest` when a caller's
/// format starts later), so no step can overflow.
public struct CivilTime: Sendable, Equatable {
    public let year: Int
    public let month: Int
    public let day: Int
    /// Seconds since midnight, 0…86,399.
    public let secondOfDay: Int

    /// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    public static let firstSecond: Int64 = -62_167_219_200
    public static let lastSecond: Int64 = 253_402_300_799

    public var hour: Int { secondOfDay / 3_600 }
    public var minute: Int { secondOfDay / 60 % 60 }
    public var second: Int { secondOfDay % 60 }

    /// The fields of `epochSeconds`, clamped to `earliest` (at least year 0000) … 9999-12-31T23:59:59Z.
    public init(epochSeconds: Int64, earliest: Int64 = CivilTime.firstSecond) {
        let t = min(max(epochSeconds, max(earliest, Self.firstSecond)), Self.lastSecond)
        let days = t >= 0 ? t / 86_400 : (t - 86_399) / 86_400  // floor: before 1970 is the day before
        secondOfDay = Int(t - days * 86_400)
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097                                         // [0, 146096]
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365  // [0, 399]
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)                   // [0, 365]
        let mp = (5 * doy + 2) / 153                                        // [0, 11]
        day = Int(doy - (153 * mp + 2) / 5 + 1)
        month = Int(mp < 10 ? mp + 3 : mp - 9)
        year = Int(yoe + era * 400 + (month <= 2 ? 1 : 0))
    }

    /// Days since 1970-01-01 of a date (the callers range-check year, month and day first).
    public static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339 §5.6, UTC).
    public var rfc3339: String {
        Self.pad(year, 4) + "-" + Self.pad(month, 2) + "-" + Self.pad(day, 2) + "T"
            + Self.pad(hour, 2) + ":" + Self.pad(minute, 2) + ":" + Self.pad(second, 2) + "Z"
    }

    /// `YYYYMMDDTHHMMSSZ` (ISO 8601 basic, SigV4's `X-Amz-Date`).
    public var iso8601Basic: String {
        Self.pad(year, 4) + Self.pad(month, 2) + Self.pad(day, 2) + "T" + Self.pad(hour, 2) + Self.pad(minute, 2) + Self.pad(second, 2) + "Z"
    }

    static func pad(_ v: Int, _ width: Int) -> String {
        let s = String(v)
        return s.utf8.count >= width ? s : String(repeating: "0", count: width - s.utf8.count) + s
    }
}
