import BearerdOAuth
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
import BearerdProxyCore
#endif

/// Blocking file access for configuration loading and secret resolution. Runs only at start-up,
/// in `bearerd check` and on SIGHUP — never on an event loop. Error texts are `strerror` messages
/// (`No such file or directory`), never file contents.
enum ConfigFiles {
    /// What went wrong reading a file, as users see it after `cannot read PATH: `.
    struct Failure: Error, Equatable {
        var reason: String
    }

    /// Reads a whole file, refusing directories and files over `limit` bytes. `credential`
    /// (every secret, key and token file; the default): the file must be a regular file — see
    /// `openForReading`. The configuration file itself may be a pipe (`-c <(…)`).
    static func readAll(_ path: String, limit: Int, credential: Bool = true) throws(Failure) -> [UInt8] {
        let fd = try openForReading(path, credential: credential)
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw Failure(reason: errnoText())
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            if bytes.count > limit { throw Failure(reason: "larger than \(limit) bytes") }
        }
        return bytes
    }

    /// Checks that `path` can be opened for reading and is a regular file.
    static func checkReadable(_ path: String) throws(Failure) {
        close(try openForReading(path, credential: true))
    }

    /// Opens `path` read-only, refusing directories; the caller closes the descriptor.
    /// `credential`: opened with `O_NONBLOCK` (opening a FIFO would otherwise wait for a writer
    /// and hang the session or the start) and refused unless `fstat` says it is a regular file
    /// (symlinks, as Kubernetes mounts secrets, are followed to the file they name).
    private static func openForReading(_ path: String, credential: Bool) throws(Failure) -> Int32 {
        let fd = open(path, O_RDONLY | O_CLOEXEC | (credential ? O_NONBLOCK : 0))
        guard fd >= 0 else { throw Failure(reason: errnoText()) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let failure = Failure(reason: errnoText())
            close(fd)
            throw failure
        }
        let type = info.st_mode & S_IFMT
        if type == S_IFDIR {
            close(fd)
            throw Failure(reason: "is a directory")
        }
        if credential, type != S_IFREG {
            close(fd)
            let kind = type == S_IFIFO ? "a FIFO" : type == S_IFSOCK ? "a socket" : type == S_IFCHR || type == S_IFBLK ? "a device" : "not a regular file"
            throw Failure(reason: "is \(kind), not a regular file (credentials are read from regular files only)")
        }
        return fd
    }

    /// Whether `path` exists, and if so whether it is a directory.
    static func kind(of path: String) -> (exists: Bool, isDirectory: Bool) {
        var info = stat()
        guard stat(path, &info) == 0 else { return (false, false) }
        return (true, (info.st_mode & S_IFMT) == S_IFDIR)
    }

    static func errnoText() -> String {
        String(cString: strerror(errno))
    }

    enum Decoded: Equatable {
        case text(String)
        /// Not UTF-8; the 1-based line of the first invalid byte.
        case invalid(line: Int)
    }

    /// Decodes UTF-8, or names the 1-based line of the first invalid byte.
    static func decodeUTF8(_ bytes: [UInt8]) -> Decoded {
        var line = 1
        var iterator = bytes.makeIterator()
        var parser = Unicode.UTF8.ForwardParser()
        while true {
            switch parser.parseScalar(from: &iterator) {
            case .valid(let encoded):
                if encoded.count == 1, encoded.first == 0x0A { line += 1 }
            case .emptyInput:
                return .text(String(decoding: bytes, as: UTF8.self))
            case .error:
                return .invalid(line: line)
            }
        }
    }

    /// `path` unchanged if absolute (or if `file` has no directory part), else relative to the
    /// directory of the configuration file `file`.
    static func resolve(_ path: String, relativeTo file: String) -> String {
        guard !path.hasPrefix("/"), let slash = file.lastIndex(of: "/") else { return path }
        let directory = file[..<slash]
        return directory.isEmpty ? "/" + path : directory + "/" + path
    }
}
