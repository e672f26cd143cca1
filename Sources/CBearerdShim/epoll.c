#include <sys/epoll.h>
#include <errno.h>
#include "bearerd_epoll.h"

int bearerd_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int bearerd_epoll_add(int epfd, int fd) {
    struct epoll_event ev;
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = 0;
    ev.data.fd = fd;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int bearerd_epoll_add_level(int epfd, int fd) {
    struct epoll_event ev;
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    ev.data.fd = fd;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int bearerd_epoll_del(int epfd, int fd) {
    struct epoll_event ev = {0};
    return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, &ev);
}

int bearerd_epoll_poll(int epfd, int32_t *fds, uint32_t *flags, int max, int timeout_ms) {
    struct epoll_event events[512];
    if (max > 512) max = 512;
    int n;
    do { n = epoll_wait(epfd, events, max, timeout_ms); } while (n < 0 && errno == EINTR);
    for (int i = 0; i < n; i++) {
        uint32_t e = events[i].events, f = 0;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) f |= 1;
        if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) f |= 2;
        if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) f |= 4;
        fds[i] = events[i].data.fd;
        flags[i] = f;
    }
    return n;
}
