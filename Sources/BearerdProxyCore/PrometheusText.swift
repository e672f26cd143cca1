/// Writes the Prometheus text exposition format, version 0.0.4 (the format a `/metrics`
/// scrape reads with `Content-Type: text/plain; version=0.0.4`).
///
/// Owns the text built so far. Rules it keeps (the format's, checked by the real parser in the
/// end-to-end test): each family is introduced once by `# HELP` and `# TYPE` and its samples
/// follow contiguously; label values escape `\`, `"` and line feed; `# HELP` text escapes `\`
/// and line feed; floats print as Go does for the special values (`NaN`, `+Inf`, `-Inf`); a
/// histogram has one `_bucket` per bound in increasing order, the last with `le="+Inf"`, then
/// `_sum` and `_count` (equal to the `+Inf` bucket). Counter family names end in `_total`.
/// Metric and label names are the caller's constants and are not validated here.
package struct PrometheusText {
    package enum Kind: String {
        case counter, gauge, histogram
    }

    package private(set) var text = ""

    package init() {
        text.reserveCapacity(8 * 1024)
    }

    /// Opens a family: its `# HELP` and `# TYPE` lines.
    package mutating func family(_ name: String, _ kind: Kind, help: String) {
        text += "# HELP " + name + " " + Self.escapeHelp(help) + "\n"
        text += "# TYPE " + name + " " + kind.rawValue + "\n"
    }

    package mutating func sample(_ name: String, _ labels: [(String, String)], _ value: UInt64) {
        line(name, labels, String(value))
    }

    package mutating func sample(_ name: String, _ labels: [(String, String)], _ value: Int) {
        line(name, labels, String(value))
    }

    package mutating func sample(_ name: String, _ labels: [(String, String)], _ value: Double) {
        line(name, labels, Self.format(value))
    }

    /// The samples of one histogram series (the family must be open, of kind `.histogram`).
    package mutating func histogram(_ name: String, _ labels: [(String, String)], _ h: LatencyHistogram) {
        var cumulative: UInt64 = 0
        for (i, le) in LatencyHistogram.boundLabels.enumerated() {
            cumulative &+= h.counts[i]
            line(name + "_bucket", labels + [("le", le)], String(cumulative))
        }
        line(name + "_bucket", labels + [("le", "+Inf")], String(h.count))
        line(name + "_sum", labels, Self.format(h.sumSeconds))
        line(name + "_count", labels, String(h.count))
    }

    private mutating func line(_ name: String, _ labels: [(String, String)], _ value: String) {
        text += name
        if !labels.isEmpty {
            text += "{"
            for (i, (k, v)) in labels.enumerated() {
                if i > 0 { text += "," }
                text += k + "=\"" + Self.escapeLabelValue(v) + "\""
            }
            text += "}"
        }
        text += " " + value + "\n"
    }

    /// Label value escaping of the text format: `\` → `\\`, `"` → `\"`, line feed → `\n`.
    package static func escapeLabelValue(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 == 0x5C || $0 == 0x22 || $0 == 0x0A }) else { return s }
        var out = ""
        for c in s.unicodeScalars {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }

    /// `# HELP` escaping: `\` → `\\`, line feed → `\n` (quotes stay as they are).
    package static func escapeHelp(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 == 0x5C || $0 == 0x0A }) else { return s }
        var out = ""
        for c in s.unicodeScalars {
            switch c {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }

    /// A sample value: Go's spelling of the special values, else Swift's shortest round-trip form.
    package static func format(_ v: Double) -> String {
        if v.isNaN { return "NaN" }
        if v.isInfinite { return v > 0 ? "+Inf" : "-Inf" }
        return v.description
    }
}

/// Upstream latency of one route, in fixed buckets from 5 ms to 30 s.
///
/// Owns one counter per bucket (not cumulative: the writer accumulates) plus one for
/// observations above the largest bound, and the sum in nanoseconds. A value type of fixed
/// size: observing allocates nothing. Invariant: `counts.count == boundsNanos.count + 1`.
public struct LatencyHistogram: Sendable, Equatable {
    /// Upper bounds (inclusive, as Prometheus' `le`), in nanoseconds.
    package static let boundsNanos: [UInt64] = [
        5_000_000, 10_000_000, 25_000_000, 50_000_000, 100_000_000, 250_000_000, 500_000_000,
        1_000_000_000, 2_500_000_000, 5_000_000_000, 10_000_000_000, 30_000_000_000,
    ]
    /// The same bounds in seconds as `le` label values.
    package static let boundLabels = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0"]

    public private(set) var counts: [UInt64] = Array(repeating: 0, count: 13)
    public private(set) var sumNanos: UInt64 = 0

    public init() {}

    public mutating func observe(nanoseconds n: UInt64) {
        var i = 0
        let bounds = Self.boundsNanos
        while i < bounds.count && n > bounds[i] { i += 1 }
        counts[i] &+= 1
        sumNanos &+= n
    }

    public var count: UInt64 { counts.reduce(0, &+) }
    public var sumSeconds: Double { Double(sumNanos) / 1e9 }

    package mutating func merge(_ o: LatencyHistogram) {
        for i in counts.indices { counts[i] &+= o.counts[i] }
        sumNanos &+= o.sumNanos
    }
}
