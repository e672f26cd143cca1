#ifndef BEARERD_EPOLL_H
#define BEARERD_EPOLL_H
#include <stdint.h>
/* epoll for the loop poller (EventLoop.IOMode.loopPoller): struct epoll_event is packed on
   x86_64 and its flag enum imports unreliably, so Swift only sees these plain functions. */
int bearerd_epoll_create(void);
/* Registers fd edge-triggered for input, output, peer half-close and errors. */
int bearerd_epoll_add(int epfd, int fd);
/* Registers fd level-triggered for input only: reported by every wait while it is readable
   (a listening socket: while connections wait to be accepted). */
int bearerd_epoll_add_level(int epfd, int fd);
int bearerd_epoll_del(int epfd, int fd);
/* Waits up to timeout_ms (0: just look): fills fds[i] and flags[i] (bit 0 readable or hang-up/error, bit 1 writable,
   bit 2 the peer closed or the socket failed: read on to EOF). */
int bearerd_epoll_poll(int epfd, int32_t *fds, uint32_t *flags, int max, int timeout_ms);
#endif
