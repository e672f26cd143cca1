#ifndef BEARERD_SYS_H
#define BEARERD_SYS_H
#include <sys/socket.h>
/* accept4(2) needs _GNU_SOURCE, which Swift's Glibc module does not define. */
int bearerd_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
#endif
