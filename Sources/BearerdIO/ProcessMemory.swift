import CBearerdShim

/// The process's resident code after start-up.
///
/// Idle, most of bearerd's resident set is not data but code: the pages of the (static Swift
/// runtime, Foundation, YAML, argument parsing, TLS set-up) code that start-up ran, each fault
/// mapping its 64 KiB neighbourhood of the binary (fault-around). Measured on a started
/// `bearerd run`: ~14 MiB of its ~22 MiB VmRSS were the binary's code pages, 2.3 MiB anonymous
/// memory. Once serving, `releaseStartupCode()` unmaps the read-only code segments of the
/// binary and its libraries (madvise `MADV_DONTNEED`): the file stays in the page cache, and
/// what the request path runs faults back in (minor faults) on first use. Only VmRSS
/// changes: a cgroup is charged for the page cache of the binary either way.
public enum ProcessMemory {
    /// Unmaps the code pages of every loaded object; the bytes of address space released.
    @discardableResult
    public static func releaseStartupCode() -> Int {
        Int(bearerd_release_code_pages())
    }
}
