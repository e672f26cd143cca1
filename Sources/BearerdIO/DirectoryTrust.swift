#if canImport(Glibc)
import Glibc
#endif

/// Whether bearerd may create a file (a unix socket, a token sink) in a directory: no other uid
/// may be able to put, replace or remove entries there, or it could squat the name first (a
/// symlink in a sticky `/tmp` pointing at a file of its choosing) or swap the file between two
/// of bearerd's system calls.
///
/// The directory itself must be owned by bearerd's effective uid or root and writable by
/// neither group nor others (the sticky bit does not help here: it stops others removing
/// bearerd's entries, not creating their own first). Every directory above it must be owned by
/// bearerd's uid or root, and writable by group or others only with the sticky bit (then nobody
/// else can rename the directory below away). Symlinks in the path are resolved first
/// (realpath(3)) and the directories they lead to are the ones checked. Stateless.
public enum DirectoryTrust {
    /// Why `directory` is not safe to create files in, or nil when it is. A directory that does
    /// not exist is nil (creating it fails later with its own message).
    public static func problem(_ directory: String) -> String? {
        problem(directory, euid: geteuid())
    }

    /// `problem` for `euid` (tests).
    static func problem(_ directory: String, euid: uid_t) -> String? {
        guard let resolved = realpath(directory, nil) else { return nil }
        let path = String(cString: resolved)
        free(resolved)
        var current = path
        var leaf = true
        while true {
            var st = stat()
            guard stat(current, &st) == 0 else { return "cannot check \(current): \(String(cString: strerror(errno)))" }
            let shown = current == path ? current : "\(current) (above \(path))"
            if st.st_uid != euid && st.st_uid != 0 {
                return "\(shown) belongs to uid \(st.st_uid), who could replace what bearerd creates there; use a directory owned by uid \(euid) or root"
            }
            let writable = st.st_mode & (S_IWGRP | S_IWOTH) != 0
            let sticky = st.st_mode & S_ISVTX != 0
            let mode = String(st.st_mode & 0o7777, radix: 8)
            if writable && (leaf || !sticky) {
                let who = st.st_mode & S_IWOTH != 0 ? "every user" : "group \(st.st_gid)"
                return leaf
                    ? "\(shown) is writable by \(who) (mode \(mode)), who could create the name first or swap the file; use a directory only uid \(euid) (or root) can write, e.g. /run/bearerd"
                    : "\(shown) is writable by \(who) without the sticky bit (mode \(mode)), so the directory below could be swapped"
            }
            if current == "/" { return nil }
            leaf = false
            if let slash = current.lastIndex(of: "/") {
                current = slash == current.startIndex ? "/" : String(current[..<slash])
            } else {
                return nil
            }
        }
    }

    /// The directory part of a file path ("." for a bare name, "/" for a file in the root).
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }
}
