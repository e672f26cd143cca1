import Foundation

/// What a test needs from the machine (root, a tool, a Python module, a fixture), and what happens
/// when it is missing: on a developer's machine the test is skipped with the reason; under `CI`
/// (the variable set, as `.ci/run` does) it runs and fails with the reason, so a CI run never
/// passes by skipping quietly.
///
/// Use both halves: `.enabled(if: Prerequisite.runs(met), "why")` on the test, and
/// `try Prerequisite.require(met, "what")` as its first line (under CI the gate lets the test in,
/// and `require` is what fails it). Stateless.
public enum Prerequisite {
    /// True when the `CI` variable is set to anything but the empty string.
    public static var isCI: Bool {
        guard let v = ProcessInfo.processInfo.environment["CI"] else { return false }
        return !v.isEmpty
    }

    /// The `.enabled(if:)` gate: run when `met`, and always under CI.
    public static func runs(_ met: Bool) -> Bool { met || isCI }

    /// Throws (failing the test) when `met` is false. Outside CI the gate has skipped such a
    /// test already, so this only fires under CI or when a test calls it without the gate.
    public static func require(_ met: Bool, _ what: @autoclosure () -> String) throws {
        if !met { throw Missing(what: what()) }
    }

    /// For a part of a test that needs more than the rest: true when `met`; false outside CI
    /// (the caller skips that part); throws under CI.
    public static func check(_ met: Bool, _ what: @autoclosure () -> String) throws -> Bool {
        if met { return true }
        if isCI { throw Missing(what: what()) }
        return false
    }

    /// Root: setpriv to run a client or bearerd as another uid, chroot, chown.
    public static var isRoot: Bool { getuid() == 0 }

    /// The error a missing prerequisite fails a test with under CI.
    public struct Missing: Error, CustomStringConvertible {
        public let what: String
        public var description: String { "prerequisite missing under CI (tests must not skip there): \(what)" }
    }
}
