#define _GNU_SOURCE
#include <sys/socket.h>
#include <errno.h>
#include <sched.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <unistd.h>
#include "bearerd_sys.h"
int bearerd_open_path_nofollow(const char *path) { return open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC); }
int bearerd_fchown_path_fd(int fd, unsigned int owner, unsigned int group) { return fchownat(fd, "", owner, group, AT_EMPTY_PATH); }
int bearerd_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) { return accept4(fd, addr, len, flags); }
int bearerd_stream_socket(int family) { return socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0); }
int bearerd_SOCK_STREAM(void) { return SOCK_STREAM; }
int bearerd_accept_flags(void) { return SOCK_NONBLOCK | SOCK_CLOEXEC; }
int bearerd_peer_credentials(int fd, int *pid, unsigned int *uid, unsigned int *gid) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    if (len != sizeof(cred)) { errno = EINVAL; return -1; }
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

int bearerd_affinity_cpu_count(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
    return CPU_COUNT(&set);
}

ssize_t bearerd_send2(int fd, const void *first, size_t first_len, const void *second, size_t second_len) {
    struct iovec iov[2];
    iov[0].iov_base = (void *)first;
    iov[0].iov_len = first_len;
    iov[1].iov_base = (void *)second;
    iov[1].iov_len = second_len;
    struct msghdr msg = {0};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    return sendmsg(fd, &msg, MSG_NOSIGNAL);
}
