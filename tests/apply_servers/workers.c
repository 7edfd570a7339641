/*
 * A tiny server for tests/apply_servers.rs shaped like memcached -t N: the
 * main thread's loop accepts and hands each connection to the next of N
 * worker threads in turn (round robin), each running an epoll loop of its
 * own; the workers share one store under a mutex. Line commands:
 *
 *   WHO             -> WORKER i        (the worker serving this connection)
 *   APPEND key tok  -> OK len          (appends " tok" to key's value)
 *   GET key         -> VALUE value     (or VALUE -)
 *   ACCEPTED        -> ACCEPTED yes|no (whether the listener had finished
 *                                       this connection's accept)
 *
 * Which worker a connection lands on, and the order in which the workers'
 * APPENDs to a shared key interleave, are what a backup must reproduce.
 *
 * What the listener does after an accept, in the same turn, must keep its
 * order too: memcached's listener runs its clock timer after an accept,
 * and the worker's commands read the clock it set. Here the listener,
 * after handing the connection over, works a while (a sleep) and then
 * marks the accept finished. On the leader a worker's turn never overlaps
 * the listener's (lockstep's turn lock): always yes. A backup that handed
 * the worker the command before the listener's turn ended would answer no.
 *
 * Usage: workers PORT N
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
#define MAX_WORKERS 16
#define MAX_CONNS 1024
#define MAX_KEYS 64
#define LINE_MAX_LEN 256
#define VALUE_MAX 65536

struct worker {
	int index;
	int epfd;
	int handoff[2];
};

struct conn {
	int fd;
	struct worker *w;
	/* Set by the listener at the end of the turn that accepted it. */
	atomic_int accept_done;
	char in[LINE_MAX_LEN];
	size_t len;
};

struct entry {
	char key[64];
	char value[VALUE_MAX];
	size_t len;
};

static struct worker workers[MAX_WORKERS];
static struct conn *conns[MAX_CONNS];
static struct entry store[MAX_KEYS];
static int keys;
static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct entry *lookup(const char *key, int create)
{
	for (int i = 0; i < keys; i++)
		if (strcmp(store[i].key, key) == 0)
			return &store[i];
	if (!create || keys == MAX_KEYS || strlen(key) >= sizeof(store[0].key))
		return NULL;
	struct entry *e = &store[keys++];
	strcpy(e->key, key);
	e->len = 0;
	e->value[0] = 0;
	return e;
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

static void close_conn(struct conn *c)
{
	epoll_ctl(c->w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	conns[c->fd] = NULL;
	free(c);
}

static void command(struct conn *c, char *line)
{
	static __thread char out[VALUE_MAX + 32];
	char key[64], tok[64];
	if (strcmp(line, "WHO") == 0) {
		snprintf(out, sizeof(out), "WORKER %d\n", c->w->index);
	} else if (strcmp(line, "ACCEPTED") == 0) {
		snprintf(out, sizeof(out), "ACCEPTED %s\n",
			 atomic_load(&c->accept_done) ? "yes" : "no");
	} else if (sscanf(line, "APPEND %63s %63s", key, tok) == 2) {
		pthread_mutex_lock(&store_lock);
		struct entry *e = lookup(key, 1);
		size_t t = strlen(tok);
		if (e != NULL && e->len + t + 2 < VALUE_MAX) {
			e->value[e->len++] = ' ';
			memcpy(e->value + e->len, tok, t + 1);
			e->len += t;
			snprintf(out, sizeof(out), "OK %zu\n", e->len);
		} else {
			snprintf(out, sizeof(out), "FULL\n");
		}
		pthread_mutex_unlock(&store_lock);
	} else if (sscanf(line, "GET %63s", key) == 1) {
		pthread_mutex_lock(&store_lock);
		struct entry *e = lookup(key, 0);
		snprintf(out, sizeof(out), "VALUE %s\n", e != NULL ? e->value : "-");
		pthread_mutex_unlock(&store_lock);
	} else {
		snprintf(out, sizeof(out), "ERROR\n");
	}
	reply(c, out);
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
			*nl = 0;
			command(c, c->in);
			memmove(c->in, c->in + line, c->len - line);
			c->len -= line;
		}
		if (c->len == sizeof(c->in)) {
			close_conn(c);
			return;
		}
	}
}

static void *worker_loop(void *arg)
{
	struct worker *w = arg;
	struct epoll_event ev[16];
	for (;;) {
		int n = epoll_wait(w->epfd, ev, 16, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("worker epoll_wait");
		for (int i = 0; i < n; i++) {
			if (ev[i].data.fd == w->handoff[0]) {
				struct conn *c;
				while (read(w->handoff[0], &c, sizeof(c)) == sizeof(c)) {
					conns[c->fd] = c;
					struct epoll_event e = {.events = EPOLLIN, .data.fd = c->fd};
					if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &e) < 0)
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
	if (argc != 3) {
		fprintf(stderr, "usage: workers PORT N\n");
		return 2;
	}
	int n = atoi(argv[2]);
	if (n < 1 || n > MAX_WORKERS) {
		fprintf(stderr, "workers: N must be 1..%d\n", MAX_WORKERS);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	/* Every loop is created here, in one order, on every replica. */
	int listen_epfd = epoll_create1(0);
	if (listen_epfd < 0)
		die("epoll_create1");
	for (int i = 0; i < n; i++) {
		struct worker *w = &workers[i];
		w->index = i;
		w->epfd = epoll_create1(0);
		if (w->epfd < 0)
			die("epoll_create1");
		if (pipe2(w->handoff, O_NONBLOCK) < 0)
			die("pipe2");
		struct epoll_event e = {.events = EPOLLIN, .data.fd = w->handoff[0]};
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->handoff[0], &e) < 0)
			die("epoll_ctl handoff");
	}

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
	struct epoll_event e = {.events = EPOLLIN, .data.fd = ls};
	if (epoll_ctl(listen_epfd, EPOLL_CTL_ADD, ls, &e) < 0)
		die("epoll_ctl listen");

	for (int i = 0; i < n; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, worker_loop, &workers[i]) != 0)
			die("pthread_create");
	}

	int next = 0;
	struct epoll_event ev[16];
	for (;;) {
		int k = epoll_wait(listen_epfd, ev, 16, -1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			die("listener epoll_wait");
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
			c->w = &workers[next];
			next = (next + 1) % n;
			if (write(c->w->handoff[1], &c, sizeof(c)) != sizeof(c)) {
				close(fd);
				free(c);
				continue;
			}
			/* The rest of the listener's turn. */
			struct timespec work = {.tv_sec = 0, .tv_nsec = LISTENER_WORK_US * 1000L};
			nanosleep(&work, NULL);
			atomic_store(&c->accept_done, 1);
		}
	}
}
