import Dispatch
import CBearerdShim
#if canImport(Glibc)
import Glibc
#endif

/// A listening socket. Accepts on `acceptLoop` and hands each new non-blocking fd to the next
/// loop of `group`, where `onAccept` runs. With the loop poller it is registered level-triggered
/// and takes one connection per report (the next wait reports it again while more wait, as
/// nginx's `multi_accept off`); a Dispatch source's event drains the backlog (bounded).
///
/// With an `AcceptBudget`, every accept first takes a slot of the process's client-connection
/// budget; at the budget the listener pauses (as for EMFILE, but with no timer) until a
/// connection's descriptor is closed and the budget resumes it.
///
/// Lives on `acceptLoop`. Invariants: `state` says whether the accept source is resumed (poller:
/// whether the socket is in the epoll set), and it is suspended at most once
/// (`pausedOutOfDescriptors` or `pausedAtBudget`), so suspend and resume balance by
/// construction; `stop()` resumes a suspended source before cancelling it (libdispatch traps on releasing a suspended source,
/// swift-service-lifecycle's `UnixSignalsSequence` does the same);
/// the fd is closed only in the accept source's cancel handler (or, with the loop poller, right
/// after leaving the epoll set).
public final class Listener: LoopPollable, @unchecked Sendable {  // @unchecked: confined to `acceptLoop`
    public let fd: Int32
    public let localAddress: SocketAddress
    /// The accept source; nil when the loop poller serves the listening socket.
    private var source: DispatchSourceRead?
    private let onAccept: (Int32, SocketAddress, EventLoop) -> Void
    private let acceptLoop: EventLoop
    private let group: EventLoopGroup
    /// The accepting loop's system calls.
    private let sys: Syscalls
    private var unixPath: String?
    /// The socket file's device and inode as bound, so a later change of its mode or owner
    /// (a reload) acts on that file only, never on whatever now has its name.
    private var unixFile: FileIdentity?
    /// The process's client-connection budget; nil: unlimited (tests, the admin of old).
    private let budget: AcceptBudget?
    private var state = AcceptState.accepting
    /// TCP_NODELAY is set on the listening socket, and Linux copies it to every connection
    /// accepted from it: no setsockopt per connection (one system call fewer per accept). False
    /// for unix sockets (no such option) and where setting it on the listener failed (then each
    /// accepted TCP connection gets it, as before).
    private let acceptedHaveNoDelay: Bool

    /// Where accepting is. Exits: `accepting` → `pausedOutOfDescriptors` (accept failed with
    /// EMFILE/ENFILE: the source is suspended or the socket left the epoll set, a retry is
    /// scheduled) → `accepting` (the retry resumed it); `accepting` → `pausedAtBudget` (the
    /// budget refused a slot; suspended the same way) → `accepting` (a release resumed it);
    /// any → `stopped` (final; a suspended source is resumed first).
    enum AcceptState: Equatable {
        case accepting
        case pausedOutOfDescriptors
        case pausedAtBudget
        case stopped
    }

    /// For tests: where accepting is now. Read on `acceptLoop`.
    var acceptState: AcceptState { state }
    /// For tests: how many retries after a pause have run (also those that found the listener
    /// stopped). Read on `acceptLoop`.
    private(set) var pauseRetriesRun = 0

    /// How long accepting pauses after running out of descriptors before trying again.
    static let outOfDescriptorsRetry: Duration = .milliseconds(100)

    /// Binds and listens. `host` is numeric ("127.0.0.1", "::1", "0.0.0.0") or a name resolved
    /// synchronously at start-up. Port 0 picks a free port (see `localAddress`).
    public static func bind(host: String, port: UInt16, group: EventLoopGroup, budget: AcceptBudget? = nil,
                            onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        guard let addr = SocketAddress.numeric(host, port: port) ?? Resolver.resolveBlocking(host: host, port: port).first else {
            throw IOError("resolve \(host)", EINVAL)
        }
        return try make(address: addr, unixFile: nil, group: group, budget: budget, onAccept: onAccept)
    }

    /// Binds and listens on a unix stream socket at `path` (unix(7)).
    ///
    /// The socket file is never wider than `mode`: the mode is set on the socket with `fchmod`
    /// before `bind` (Linux gives the new file the socket's mode masked by the umask). No
    /// chmod by path follows that a swapped name could redirect: `owner`/`fileGroup` (each nil:
    /// unchanged) and the bits the umask took away are set through a descriptor of the file
    /// opened without following symlinks and checked to be a socket, and only then does
    /// `listen` let anyone connect. The directory must be one no other uid can
    /// write (`DirectoryTrust`). A stale socket file of an earlier run is removed; a live one
    /// (something accepts on it) or a file that is not a socket is an error. Errors name the
    /// path and say what to do (missing directory, no permission, chown refused).
    public static func bindUnix(path: String, mode: UInt32 = 0o660, owner: UInt32? = nil, fileGroup: UInt32? = nil,
                                group: EventLoopGroup, budget: AcceptBudget? = nil,
                                onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        let shown = "unix:" + path
        guard let addr = SocketAddress.unix(path) else {
            throw IOError("bind \(shown)", ENAMETOOLONG, hint: "a unix socket path holds at most 107 bytes")
        }
        if let problem = DirectoryTrust.problem(DirectoryTrust.directory(of: path)) {
            throw IOError("bind \(shown)", EPERM, hint: problem)
        }
        try removeStaleSocket(path, sys: group.loops[0].syscalls)
        let file = UnixFileSettings(path: path, mode: mode, owner: owner, group: fileGroup)
        return try make(address: addr, unixFile: file, group: group, budget: budget, onAccept: onAccept)
    }

    /// A file's device and inode.
    struct FileIdentity: Equatable {
        var device: UInt64
        var inode: UInt64
    }

    /// Mode and ownership a unix socket file gets between `bind` and `listen`.
    struct UnixFileSettings {
        var path: String
        var mode: UInt32
        var owner: UInt32?
        var group: UInt32?
    }

    /// Removes a socket file left by an earlier run; refuses to touch anything else.
    private static func removeStaleSocket(_ path: String, sys: Syscalls) throws(IOError) {
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        guard (st.st_mode & S_IFMT) == S_IFSOCK else {
            throw IOError("bind unix:\(path)", EADDRINUSE, hint: "\(path) exists and is not a socket; bearerd will not remove it")
        }
        // Something still accepting there (another bearerd?) must not lose its socket.
        if let addr = SocketAddress.unix(path) {
            if let probe = try? sys.streamSocket(family: AF_UNIX) {
                let e = sys.startConnect(probe, to: addr)
                sys.closeFD(probe)
                if e == 0 || e == EAGAIN || e == EINPROGRESS {
                    throw IOError("bind unix:\(path)", EADDRINUSE, hint: "another process is listening on \(path)")
                }
            }
        }
        unlink(path)
    }

    /// The operator-facing reason a bind failed.
    private static func bindHint(_ address: SocketAddress, unixPath: String?, errno e: Int32) -> String? {
        if let path = unixPath {
            let dir = path.lastIndex(of: "/").map { path[..<$0].isEmpty ? "/" : String(path[..<$0]) } ?? "."
            switch e {
            case ENOENT: return "the directory \(dir) does not exist: create it first, e.g. with systemd's RuntimeDirectory="
            case EACCES, EPERM: return "uid \(getuid()) may not create files in \(dir)"
            case ENOTDIR: return "a component of \(dir) is not a directory"
            case EROFS: return "\(dir) is on a read-only file system"
            default: return nil
            }
        }
        switch e {
        case EADDRINUSE: return "another process is listening on \(address)"
        case EACCES: return "ports below 1024 need CAP_NET_BIND_SERVICE"
        case EADDRNOTAVAIL: return "no local interface has this address"
        default: return nil
        }
    }

    /// Takes over a listening stream socket inherited from the service manager (socket
    /// activation, sd_listen_fds(3)): checks it is a listening stream socket, sets it
    /// non-blocking and close-on-exec, and accepts on it like a bound one. The socket file of an
    /// inherited unix socket belongs to the manager: `stop()` closes the fd but never unlinks it.
    public static func adopt(fd: Int32, group: EventLoopGroup, budget: AcceptBudget? = nil,
                             onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        let sys = group.loops[0].syscalls
        let type = sys.getOption(fd, SOL_SOCKET, SO_TYPE)
        guard type >= 0 else { throw IOError("getsockopt(SO_TYPE) on fd \(fd)", Int32(-type)) }
        guard type == Int(bearerd_SOCK_STREAM()) else { throw IOError("fd \(fd) is not a stream socket", ENOTSUP) }
        let listening = sys.getOption(fd, SOL_SOCKET, SO_ACCEPTCONN)
        guard listening >= 0 else { throw IOError("getsockopt(SO_ACCEPTCONN) on fd \(fd)", Int32(-listening)) }
        guard listening != 0 else { throw IOError("fd \(fd) is not listening (Accept=yes is not supported)", EINVAL) }
        guard let local = sys.boundAddress(fd) else { throw IOError("getsockname on fd \(fd)", errno) }
        let nb = sys.setNonBlocking(fd)
        if nb < 0 { throw IOError("fcntl", Int32(-nb)) }
        _ = sys.setCloseOnExec(fd)
        deferAccept(fd, local, sys)
        return Listener(fd: fd, local: local, unixPath: nil, unixFile: nil, noDelay: setNoDelay(fd, local, sys), group: group, budget: budget,
                        onAccept: onAccept)
    }

    /// TCP_DEFER_ACCEPT on a TCP listening socket (tcp(7)): a connection is reported only once
    /// its first bytes arrived, so the accepting loop reads the request at once
    /// (`SocketChannel.start(readingFirst:)`) instead of waiting for another report. Every
    /// protocol bearerd serves speaks first from the client (HTTP/1.1, the HTTP/2 preface, a TLS
    /// ClientHello). A client that connects and stays silent is accepted after the deferral
    /// (`deferAcceptSeconds`, rounded up by the kernel to its next SYN-ACK retransmission) and
    /// then meets the header read timeout as before. A socket-activated listener keeps a
    /// deferral its unit set (`DeferAcceptSec=`). Failure changes nothing but the speed.
    private static func deferAccept(_ fd: Int32, _ local: SocketAddress, _ sys: Syscalls) {
        guard local.family != AF_UNIX, sys.getOption(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT) <= 0 else { return }
        _ = sys.setOption(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT, deferAcceptSeconds)
    }

    /// How long the kernel holds a connection that sent nothing before handing it over anyway.
    static let deferAcceptSeconds: Int32 = 1

    /// Sets TCP_NODELAY on a TCP listening socket, for the connections it accepts; whether it did.
    private static func setNoDelay(_ fd: Int32, _ local: SocketAddress, _ sys: Syscalls) -> Bool {
        local.family != AF_UNIX && sys.setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1) == 0
    }

    /// The address a socket is bound to (getsockname), nil on error.
    public static func boundAddress(fd: Int32) -> SocketAddress? {
        Syscalls.system.boundAddress(fd)
    }

    private static func make(address: SocketAddress, unixFile: UnixFileSettings?, group: EventLoopGroup, budget: AcceptBudget?,
                             onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        let sys = group.loops[0].syscalls
        let fd = try sys.streamSocket(family: address.family)
        if address.family != AF_UNIX {
            sys.setSocketOption(fd, SOL_SOCKET, SO_REUSEADDR, 1)
            if address.family == AF_INET6 { sys.setSocketOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1) }
        }
        if let file = unixFile {
            // The file is created with the socket's mode masked by the umask: never wider than
            // `mode`. The process-wide umask is left alone (threads creating files meanwhile
            // would get it); the masked bits are added through the bound file's descriptor below.
            _ = fchmod(fd, mode_t(file.mode & 0o777))
        }
        let rc = address.withSockAddr { sys.bind(fd, $0, $1) }
        let bindErrno = Int32(truncatingIfNeeded: -rc)
        if rc < 0 {
            sys.closeFD(fd)
            let shown = unixFile.map { "unix:" + $0.path } ?? address.description
            throw IOError("bind \(shown)", bindErrno, hint: bindHint(address, unixPath: unixFile?.path, errno: bindErrno))
        }
        var identity: FileIdentity?
        if let file = unixFile {
            do throws(IOError) {
                identity = try applyFileSettings(file, expecting: nil)
            } catch {
                sys.closeFD(fd)
                unlinkIfSame(file.path, nil)  // a socket in a directory only bearerd can write: the one just bound
                throw error
            }
        }
        let listened = sys.listen(fd, 1024)
        if listened < 0 {
            sys.closeFD(fd)
            if let file = unixFile { unlinkIfSame(file.path, identity) }
            throw IOError("listen", Int32(truncatingIfNeeded: -listened))
        }
        let local = address.family == AF_UNIX ? address : (sys.boundAddress(fd) ?? address)
        deferAccept(fd, local, sys)
        return Listener(fd: fd, local: local, unixPath: unixFile?.path, unixFile: identity, noDelay: setNoDelay(fd, local, sys), group: group,
                        budget: budget, onAccept: onAccept)
    }

    /// Gives this listener's socket file a new owner, group and mode (a reload changed them):
    /// through a descriptor of the file as bound (same device and inode), never by its name
    /// alone. An error when the file is gone or was replaced.
    public func applyUnixPermissions(mode: UInt32, owner: UInt32?, group: UInt32?) throws(IOError) {
        guard let path = unixPath, let identity = unixFile else {
            throw IOError("chmod \(localAddress)", ENOTSUP, hint: "only a socket file bearerd bound itself can be changed")
        }
        let file = UnixFileSettings(path: path, mode: mode, owner: owner, group: group)
        _ = try Self.applyFileSettings(file, expecting: identity)
    }

    /// Owner and group, then mode of the socket file at `file.path`, set through an O_PATH
    /// descriptor opened without following a symlink and checked to be a socket (and, with
    /// `expecting`, that very file); its identity. The mode goes through /proc/self/fd (an O_PATH
    /// descriptor takes no fchmod; glibc's fchmodat with AT_SYMLINK_NOFOLLOW does the same),
    /// and only when it differs (a fresh file already has it unless the umask took bits away).
    private static func applyFileSettings(_ file: UnixFileSettings, expecting: FileIdentity?) throws(IOError) -> FileIdentity {
        let shown = "unix:" + file.path
        let pfd = bearerd_open_path_nofollow(file.path)
        guard pfd >= 0 else {
            throw IOError("bind \(shown)", errno, hint: "\(file.path) was removed or replaced while bearerd set it up")
        }
        defer { close(pfd) }
        var st = stat()
        guard fstat(pfd, &st) == 0, (st.st_mode & S_IFMT) == S_IFSOCK else {
            throw IOError("bind \(shown)", EEXIST, hint: "\(file.path) was replaced while bearerd set it up")
        }
        let identity = FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
        if let expecting, expecting != identity {
            throw IOError("chmod \(shown)", EEXIST, hint: "\(file.path) is no longer the socket bearerd bound; restart bearerd to bind it again")
        }
        if file.owner != nil || file.group != nil {
            // -1 (UInt32.max) leaves that id unchanged (chown(2)).
            if bearerd_fchown_path_fd(pfd, file.owner ?? UInt32.max, file.group ?? UInt32.max) != 0 {
                let e = errno
                let who = [file.owner.map { "owner uid \($0)" }, file.group.map { "group gid \($0)" }].compactMap { $0 }.joined(separator: ", ")
                throw IOError("chown \(shown) to \(who)", e,
                              hint: e == EPERM ? "only root (CAP_CHOWN) may give a file away; a process may set the group only to one of its own groups" : nil)
            }
        }
        let wanted = mode_t(file.mode & 0o777)
        if st.st_mode & 0o7777 != wanted && chmod("/proc/self/fd/\(pfd)", wanted) != 0 {
            throw IOError("chmod \(shown) to \(String(file.mode, radix: 8))", errno, hint: errno == ENOENT ? "/proc is not mounted" : nil)
        }
        return identity
    }

    /// Removes the socket file at `path` if it is still the one with `identity` (nil: any socket).
    private static func unlinkIfSame(_ path: String, _ identity: FileIdentity?) {
        var st = stat()
        guard lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFSOCK else { return }
        if let identity, identity != FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino)) { return }
        unlink(path)
    }

    private init(fd: Int32, local: SocketAddress, unixPath: String?, unixFile: FileIdentity?, noDelay: Bool, group: EventLoopGroup,
                 budget: AcceptBudget?, onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) {
        self.fd = fd
        self.unixFile = unixFile
        self.budget = budget
        self.acceptedHaveNoDelay = noDelay
        self.localAddress = local
        self.unixPath = unixPath
        self.group = group
        self.acceptLoop = group.loops[0]
        self.sys = group.loops[0].syscalls
        self.onAccept = onAccept
        if acceptLoop.ioMode == .loopPoller {
            acceptLoop.execute { [self] in acceptLoop.registerPollable(fd: fd, self, trigger: .level) }
            return
        }
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: acceptLoop.queue)
        source.setCancelHandler { [fd, sys] in sys.closeFD(fd) }
        // Weak: the listener may be released on another thread while an accept event is on its
        // way (`stop()` cancels the source; an event before that finds nil, never a freed object).
        source.setEventHandler { [weak self] in
            self?.acceptAll()
        }
        source.resume()
        self.source = source
    }

    /// Level-triggered: one connection per report. Draining to EAGAIN instead cost a failed
    /// accept4 after almost every batch, and the kernel allocates (and then frees) the new
    /// socket's inode, file and dentry before it finds the queue empty.
    public func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
        if readable && state == .accepting { _ = acceptOne() }
    }

    /// A Dispatch source's event: drains the backlog, at most 256 per event (the source is
    /// level-triggered and fires again while connections wait).
    private func acceptAll() {
        guard state == .accepting else { return }
        for _ in 0..<256 {
            guard acceptOne() else { return }
        }
    }

    /// Accepts one connection and hands it to a loop; false when none was taken (none waiting,
    /// a failure, or out of descriptors: then accepting pauses).
    private func acceptOne() -> Bool {
        if let budget, !budget.admit(self) {
            pause(.pausedAtBudget)
            return false
        }
        let cfd: Int32
        let peer: SocketAddress
        switch sys.acceptOne(fd) {
        case .accepted(let f, let p):
            cfd = f
            peer = p
            budget?.accepted()
        case .wouldBlock, .failed:
            budget?.cancel()
            return false
        case .outOfDescriptors(let e):
            budget?.cancel()
            budget?.ranOutOfDescriptors(e)
            pause(.pausedOutOfDescriptors)
            return false
        }
        if peer.family != AF_UNIX && !acceptedHaveNoDelay { sys.setSocketOption(cfd, Int32(IPPROTO_TCP), TCP_NODELAY, 1) }
        let loop = group.next()
        if loop === acceptLoop {
            onAccept(cfd, peer, loop)
        } else {
            loop.execute { [onAccept] in onAccept(cfd, peer, loop) }
        }
        return true
    }

    /// Stops accepting (the backlog waits in the kernel meanwhile): out of descriptors, for
    /// `outOfDescriptorsRetry`, instead of spinning on a readable socket that cannot be
    /// accepted; at the budget, until `resumeFromBudget`. The poller would report the
    /// level-triggered socket at every wait: it leaves the epoll set.
    private func pause(_ why: AcceptState) {
        guard state == .accepting else { return }
        state = why
        if let source {
            source.suspend()
        } else {
            acceptLoop.unregisterPollable(fd: fd)
        }
        if why == .pausedOutOfDescriptors {
            acceptLoop.schedule(after: Self.outOfDescriptorsRetry) { [weak self] in self?.retryAfterOutOfDescriptors() }
        }
    }

    /// The budget has room again (any thread): accepting goes on, on `acceptLoop`.
    func resumeFromBudget() {
        acceptLoop.execute { [weak self] in
            guard let self, state == .pausedAtBudget else { return }
            resumeAccepting()
        }
    }

    /// Paused → accepting. Both kinds of readiness are level-triggered: reported again at once
    /// if connections wait.
    private func resumeAccepting() {
        state = .accepting
        if let source {
            source.resume()
        } else {
            acceptLoop.registerPollable(fd: fd, self, trigger: .level)
        }
    }

    private func retryAfterOutOfDescriptors() {
        pauseRetriesRun &+= 1
        guard state == .pausedOutOfDescriptors else { return }  // stopped meanwhile
        resumeAccepting()
    }

    /// Stops accepting; the fd is closed in the cancel handler.
    public func stop() {
        acceptLoop.execute { [self] in
            let was = state
            guard was != .stopped else { return }
            state = .stopped
            if let source {
                if was != .accepting { source.resume() }  // never cancel a suspended source
                source.cancel()
            } else {
                if was == .accepting { acceptLoop.unregisterPollable(fd: fd) }  // paused: already out of the set
                sys.closeFD(fd)
            }
            if let unixPath { Self.unlinkIfSame(unixPath, unixFile) }
        }
    }
}
