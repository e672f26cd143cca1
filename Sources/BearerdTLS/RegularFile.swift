#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads key files for OpenSSL ourselves instead of by path (`BIO_new_file`): opened with
/// `O_NONBLOCK` and refused unless `fstat` says it is a regular file, so a FIFO (or a device)
/// named as a key makes a clear error instead of a start or a session that hangs in `open`.
public enum RegularFile {
    /// Why a file was not read: a `strerror` text or what the file is (never its content).
    public struct Failure: Error {
        public var reason: String
    }

    /// The whole file, at most `limit` bytes; the error says why not (never the content).
    public static func read(_ path: String, limit: Int = 1 << 20) -> Result<[UInt8], Failure> {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return .failure(Failure(reason: String(cString: strerror(errno)))) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .failure(Failure(reason: String(cString: strerror(errno)))) }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            let type = info.st_mode & S_IFMT
            let kind = type == S_IFDIR ? "a directory" : type == S_IFIFO ? "a FIFO" : type == S_IFSOCK ? "a socket"
                : type == S_IFCHR || type == S_IFBLK ? "a device" : "not a regular file"
            return .failure(Failure(reason: "is \(kind), not a regular file (credentials are read from regular files only)"))
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return .failure(Failure(reason: String(cString: strerror(errno))))
            }
            if n == 0 { return .success(bytes) }
            bytes.append(contentsOf: chunk[0..<n])
            if bytes.count > limit { return .failure(Failure(reason: "larger than \(limit) bytes")) }
        }
    }
}
