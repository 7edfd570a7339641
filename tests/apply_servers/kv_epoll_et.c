/*
 * A tiny in-memory key-value server for tests/apply_servers.rs that waits in
 * epoll_wait(2) with edge-triggered interest (EPOLLET): on each readiness it
 * accepts / recv()s until EAGAIN, as an edge-triggered loop must. One
 * process, one thread, all state in memory. Same commands as kv.pl:
 *
 *   APPEND key value  -> OK <seq> <new length>
 *   INCR key          -> OK <seq> <new value>
 *   DEL key           -> OK <seq> <1|0>
 *   GET key           -> VALUE <value> | NIL
 *   DUMP              -> KEY <key> <value> ... (sorted), then END <seq> <keys>
 *
 * Usage: kv_epoll_et PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

struct buf {
	char *p;
	size_t len, cap;
};

struct conn {
	int fd;
	struct buf in, out;
};

struct item {
	char *key;
	struct buf val;
};

static struct item *items;
static size_t nitems, capitems;
static unsigned long long seq;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void put(struct buf *b, const char *p, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			die("realloc");
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

static void putf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct buf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	put(b, tmp, (size_t)n);
}

static struct item *find(const char *key, int create)
{
	for (size_t i = 0; i < nitems; i++)
		if (strcmp(items[i].key, key) == 0)
			return &items[i];
	if (!create)
		return NULL;
	if (nitems == capitems) {
		capitems = capitems * 2 + 16;
		items = realloc(items, capitems * sizeof *items);
		if (!items)
			die("realloc");
	}
	struct item *it = &items[nitems++];
	it->key = strdup(key);
	memset(&it->val, 0, sizeof it->val);
	return it;
}

static int by_key(const void *a, const void *b)
{
	return strcmp(((const struct item *)a)->key, ((const struct item *)b)->key);
}

static void command(char *line, struct buf *out)
{
	char *cmd = line, *key = NULL, *value = NULL;
	char *sp = strchr(line, ' ');
	if (sp) {
		*sp = 0;
		key = sp + 1;
		sp = strchr(key, ' ');
		if (sp) {
			*sp = 0;
			value = sp + 1;
		}
	}
	if (strcmp(cmd, "APPEND") == 0 && value) {
		struct item *it = find(key, 1);
		put(&it->val, value, strlen(value));
		putf(out, "OK %llu %zu\n", ++seq, it->val.len);
	} else if (strcmp(cmd, "INCR") == 0 && key) {
		struct item *it = find(key, 1);
		char num[32];
		size_t n = it->val.len < sizeof num - 1 ? it->val.len : sizeof num - 1;
		memcpy(num, it->val.p ? it->val.p : "", n);
		num[n] = 0;
		long long v = atoll(num) + 1;
		it->val.len = 0;
		putf(&it->val, "%lld", v);
		putf(out, "OK %llu %lld\n", ++seq, v);
	} else if (strcmp(cmd, "DEL") == 0 && key) {
		struct item *it = find(key, 0);
		if (it) {
			free(it->key);
			free(it->val.p);
			*it = items[--nitems];
		}
		putf(out, "OK %llu %d\n", ++seq, it ? 1 : 0);
	} else if (strcmp(cmd, "GET") == 0 && key) {
		struct item *it = find(key, 0);
		if (it) {
			put(out, "VALUE ", 6);
			put(out, it->val.p ? it->val.p : "", it->val.len);
			put(out, "\n", 1);
		} else {
			put(out, "NIL\n", 4);
		}
	} else if (strcmp(cmd, "DUMP") == 0) {
		qsort(items, nitems, sizeof *items, by_key);
		for (size_t i = 0; i < nitems; i++) {
			putf(out, "KEY %s ", items[i].key);
			put(out, items[i].val.p ? items[i].val.p : "", items[i].val.len);
			put(out, "\n", 1);
		}
		putf(out, "END %llu %zu\n", seq, nitems);
	} else {
		put(out, "ERR unknown command\n", 20);
	}
}

static void set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		die("fcntl");
}

static void drop(int ep, struct conn *c)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c->in.p);
	free(c->out.p);
	free(c);
}

/* Writes what it can of c->out; asks for EPOLLOUT while some is left.
 * Returns -1 when the connection is broken. */
static int flush(int ep, struct conn *c)
{
	size_t done = 0;
	while (done < c->out.len) {
		ssize_t n = send(c->fd, c->out.p + done, c->out.len - done, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0)
			return -1;
		done += (size_t)n;
	}
	memmove(c->out.p, c->out.p + done, c->out.len - done);
	c->out.len -= done;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET | (c->out.len ? EPOLLOUT : 0),
				  .data.ptr = c };
	if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		die("epoll_ctl mod");
	return 0;
}

/* Edge-triggered: recv until EAGAIN. Returns -1 once the client is gone. */
static int serve(int ep, struct conn *c)
{
	char tmp[65536];
	int gone = 0;
	for (;;) {
		ssize_t n = recv(c->fd, tmp, sizeof tmp, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			gone = 1;
			break;
		}
		put(&c->in, tmp, (size_t)n);
		size_t start = 0;
		for (size_t i = 0; i < c->in.len; i++) {
			if (c->in.p[i] != '\n')
				continue;
			c->in.p[i] = 0;
			if (i > start && c->in.p[i - 1] == '\r')
				c->in.p[i - 1] = 0;
			command(c->in.p + start, &c->out);
			start = i + 1;
		}
		memmove(c->in.p, c->in.p + start, c->in.len - start);
		c->in.len -= start;
	}
	if (gone) {
		flush(ep, c); /* the replies to what it sent before EOF */
		return -1;
	}
	return flush(ep, c);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s PORT\n", argv[0]);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	int port = atoi(argv[1]);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		die("socket");
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((unsigned short)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0)
		die("bind");
	if (listen(l, 128) < 0)
		die("listen");
	set_nonblocking(l);
	int ep = epoll_create1(0);
	if (ep < 0)
		die("epoll_create1");
	struct epoll_event lev = { .events = EPOLLIN | EPOLLET, .data.ptr = NULL };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, l, &lev) < 0)
		die("epoll_ctl add listener");
	fprintf(stderr, "kv (epoll, edge-triggered) listening on 127.0.0.1:%d\n", port);

	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (!c) {
				for (;;) {
					int fd = accept(l, NULL, NULL);
					if (fd < 0 && errno == EINTR)
						continue;
					if (fd < 0)
						break; /* EAGAIN: all accepted */
					set_nonblocking(fd);
					struct conn *nc = calloc(1, sizeof *nc);
					if (!nc)
						die("calloc");
					nc->fd = fd;
					struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = nc };
					if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
						die("epoll_ctl add");
				}
				continue;
			}
			int bad = 0;
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
				bad = serve(ep, c) < 0;
			else if (evs[i].events & EPOLLOUT)
				bad = flush(ep, c) < 0;
			if (bad)
				drop(ep, c);
		}
	}
}
