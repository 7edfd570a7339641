/*
 * A tiny server for tests/apply_servers.rs with two event loops on two
 * threads, shaped like memcached -t 1: the main thread's loop accepts and
 * hands each connection to a worker thread's loop, which serves it.
 *
 * What the listener does after an accept, in the same turn, is what a
 * backup must keep in order: memcached's listener runs its clock timer
 * after an accept, and the worker's commands read the clock it set. Here
 * the listener, after handing the connection over, works a while (a
 * sleep) and then marks the connection's accept finished; the worker
 * answers
 *
 *   ACCEPTED  -> ACCEPTED yes | ACCEPTED no
 *
 * (whether the listener had finished this connection's accept). On the
 * leader a worker's turn never overlaps the listener's (lockstep's turn
 * lock): always yes. A backup that handed the worker the command before
 * the listener's turn ended would answer no.
 *
 * Usage: two_loops PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* How long the listener works after an accept (µs). */
#define LISTENER_WORK_US 100000
#define MAX_CONNS 1024
#define LINE_MAX_LEN 256

static int worker_epfd;
static int handoff[2];

struct conn {
	int fd;
	/* Set by the listener at the end of the turn that accepted it. */
	atomic_int accept_done;
	char in[LINE_MAX_LEN];
	size_t len;
};

static struct conn *conns[MAX_CONNS];

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void close_conn(struct conn *c)
{
	epoll_ctl(worker_epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	conns[c->fd] = NULL;
	free(c);
}

static void reply(struct conn *c, const char *s)
{
	size_t n = strlen(s), off = 0;
	while (off < n) {
		ssize_t w = write(c->fd, s + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (size_t)w;
	}
}

static void serve(struct conn *c)
{
	for (;;) {
		ssize_t r = read(c->fd, c->in + c->len, sizeof(c->in) - c->len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r <= 0) {
			close_conn(c);
			return;
		}
		c->len += (size_t)r;
		char *nl;
		while ((nl = memchr(c->in, '\n', c->len)) != NULL) {
			size_t line = (size_t)(nl - c->in) + 1;
			char out[64];
			if (strncmp(c->in, "ACCEPTED", 8) == 0)
				snprintf(out, sizeof(out), "ACCEPTED %s\n",
					 atomic_load(&c->accept_done) ? "yes" : "no");
			else
				snprintf(out, sizeof(out), "ERROR\n");
			reply(c, out);
			memmove(c->in, c->in + line, c->len - line);
			c->len -= line;
		}
		if (c->len == sizeof(c->in)) {
			close_conn(c);
			return;
		}
	}
}

static void *worker(void *arg)
{
	(void)arg;
	struct epoll_event ev[16];
	for (;;) {
		int n = epoll_wait(worker_epfd, ev, 16, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("worker epoll_wait");
		for (int i = 0; i < n; i++) {
			if (ev[i].data.fd == handoff[0]) {
				struct conn *c;
				while (read(handoff[0], &c, sizeof(c)) == sizeof(c)) {
					int fd = c->fd;
					conns[fd] = c;
					struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
					if (epoll_ctl(worker_epfd, EPOLL_CTL_ADD, fd, &e) < 0)
						die("epoll_ctl conn");
				}
				continue;
			}
			int fd = ev[i].data.fd;
			if (fd >= 0 && fd < MAX_CONNS && conns[fd] != NULL)
				serve(conns[fd]);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: two_loops PORT\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	/* Both loops are created here, in one order, on every replica. */
	int listen_epfd = epoll_create1(0);
	worker_epfd = epoll_create1(0);
	if (listen_epfd < 0 || worker_epfd < 0)
		die("epoll_create1");
	if (pipe2(handoff, O_NONBLOCK) < 0)
		die("pipe2");
	struct epoll_event e = {.events = EPOLLIN, .data.fd = handoff[0]};
	if (epoll_ctl(worker_epfd, EPOLL_CTL_ADD, handoff[0], &e) < 0)
		die("epoll_ctl handoff");

	int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (ls < 0)
		die("socket");
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("bind");
	if (listen(ls, 128) < 0)
		die("listen");
	e.data.fd = ls;
	if (epoll_ctl(listen_epfd, EPOLL_CTL_ADD, ls, &e) < 0)
		die("epoll_ctl listen");

	pthread_t t;
	if (pthread_create(&t, NULL, worker, NULL) != 0)
		die("pthread_create");

	struct epoll_event ev[16];
	for (;;) {
		int n = epoll_wait(listen_epfd, ev, 16, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("listener epoll_wait");
		for (int i = 0; i < n; i++) {
			int fd;
			while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
				if (fd >= MAX_CONNS) {
					close(fd);
					continue;
				}
				struct conn *c = calloc(1, sizeof(*c));
				if (c == NULL)
					die("calloc");
				c->fd = fd;
				if (write(handoff[1], &c, sizeof(c)) != sizeof(c)) {
					close(fd);
					free(c);
					continue;
				}
				/* The rest of the listener's turn. */
				struct timespec w = {.tv_sec = 0, .tv_nsec = LISTENER_WORK_US * 1000L};
				nanosleep(&w, NULL);
				atomic_store(&c->accept_done, 1);
			}
		}
	}
}
