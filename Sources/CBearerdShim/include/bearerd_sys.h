#ifndef BEARERD_SYS_H
#define BEARERD_SYS_H
#include <sys/socket.h>
#include <sys/types.h>
/* accept4(2) needs _GNU_SOURCE, which Swift's Glibc module does not define. */
int bearerd_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
/* A non-blocking, close-on-exec stream socket. (SOCK_STREAM and friends are an enum in glibc
   whose import into Swift is not reliable across build modes.) */
int bearerd_stream_socket(int family);
int bearerd_SOCK_STREAM(void);
int bearerd_accept_flags(void);
/* SO_PEERCRED of a connected unix socket (struct ucred needs _GNU_SOURCE). 0, or -1 with errno. */
int bearerd_peer_credentials(int fd, int *pid, unsigned int *uid, unsigned int *gid);
/* CPUs this process may run on (sched_getaffinity: taskset, cpusets), or -1. */
int bearerd_affinity_cpu_count(void);
/* sendmsg(2) of two buffers in order, MSG_NOSIGNAL (a gathered write: queued output, then the
   caller's bytes, in one system call). Bytes sent, or -1 with errno. */
ssize_t bearerd_send2(int fd, const void *first, size_t first_len, const void *second, size_t second_len);
/* Unmaps the pages of every loaded object's read-only code segments (madvise MADV_DONTNEED; the
   file stays in the page cache, a later call faults its page back in). Bytes of address space
   released. Objects with text relocations and writable segments are left alone. */
long bearerd_release_code_pages(void);
/* open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC): a descriptor of the file itself, never of a
   symlink's target (O_PATH needs _GNU_SOURCE). The descriptor, or -1 with errno. */
int bearerd_open_path_nofollow(const char *path);
/* fchownat(fd, "", owner, group, AT_EMPTY_PATH): changes the file an O_PATH descriptor names.
   0, or -1 with errno. */
int bearerd_fchown_path_fd(int fd, unsigned int owner, unsigned int group);
#endif
