/*
 * skein: the CNI plugin a runtime execs, for every ADD, DEL, CHECK, GC and
 * STATUS. It is skein-cni's fast path, in C because a Go program's start
 * alone (its runtime's threads, signal handlers, heap and page faults)
 * costs ~1.5 ms of CPU here against ~0.45 ms for a static C program, on
 * every call (docs/architecture.md, "The CNI binary").
 *
 * It does what skein-cni (cmd/skein-cni, internal/cnirun) does on its
 * common path and nothing more: reads stdin, stats two namespaces, hands
 * the CNI_ variables and stdin to skeind in one frame (internal/cnirun's
 * wire.go: the format is the same) and prints what skeind answers with the
 * exit status it gives. Everything else it leaves to skein-cni, found next
 * to it, which it execs in its place:
 *
 *   - before reading stdin: no CNI_COMMAND (the "about" lines), VERSION,
 *     or a verb it does not know;
 *   - stdin replayed (a memfd): a configuration it would have to read
 *     more carefully than it does to find "socket" (see find_socket), too
 *     long, or skeind not reachable before anything was sent. skein-cni
 *     then calls skeind itself, or says why it cannot;
 *   - stdin replayed and "--skein-failed=WHAT": anything that goes wrong
 *     once the request was sent. skein-cni only words the error then (the
 *     request is never sent twice: skeind may have run it).
 *
 * So there is one implementation of every message and of the spec's
 * rules, skein-cni's, and this file is only bytes moved.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* internal/cnirun/wire.go */
#define REQUEST_MAGIC "SKEIN-RUN/1\n"
#define REPLY_MAGIC "SKEIN-OUT/1\n"
#define MAX_STDIN (4 << 20)
#define MAX_STDOUT (16 << 20)
#define SERVICE "skein.v1.CNI"
/* internal/cnirun/plugin.go: CallTimeout, callGrace, DefaultSocket */
#ifndef CALL_TIMEOUT_MS
#define CALL_TIMEOUT_MS 60000
#endif
#define CALL_GRACE_MS 1000
#define DEFAULT_SOCKET "/run/skein/skeind.sock"

#define FALLBACK "skein-cni"
#define FAILED_FLAG "--skein-failed="

/* The CNI_ variables skeind is sent, in internal/cnirun's order. */
static const char *const env_names[] = {
	"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME",
	"CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE",
};
#define NENV (sizeof env_names / sizeof env_names[0])

static const char *const verbs[] = {"ADD", "DEL", "CHECK", "GC", "STATUS"};

static char **saved_argv;
static char what_buf[32];

/* fallback execs skein-cni with the same environment, stdin replaced by
 * data when given, "--skein-failed=<what>" as its argument when what is
 * set. It returns only if that fails, having printed why. */
static int fallback(const char *data, size_t n, int replay, const char *what)
{
	char self[PATH_MAX], path[PATH_MAX + sizeof FALLBACK];
	ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
	if (len <= 0) {
		/* No /proc: the directory argv[0] names, if it names one. */
		const char *a0 = saved_argv[0] ? saved_argv[0] : "";
		len = (ssize_t)strnlen(a0, sizeof self - 1);
		memcpy(self, a0, (size_t)len);
	}
	self[len] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		slash[1] = 0;
	else
		strcpy(self, "./");
	snprintf(path, sizeof path, "%s%s", self, FALLBACK);

	if (replay) {
		int fd = memfd_create("skein-stdin", MFD_CLOEXEC);
		size_t off = 0;
		while (fd >= 0 && off < n) {
			ssize_t w = write(fd, data + off, n - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				close(fd);
				fd = -1;
				break;
			}
			off += (size_t)w;
		}
		/* dup2 clears close-on-exec on the copy. */
		if (fd < 0 || lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) {
			int e = errno;
			printf("{\n    \"cniVersion\": \"1.1.0\",\n    \"code\": 5,\n"
			       "    \"msg\": \"skein: cannot hand the call to %s: %s\"\n}\n",
			       FALLBACK, strerror(e));
			return 1;
		}
		close(fd);
	}
	char flag[sizeof FAILED_FLAG + 32];
	char *argv[] = {saved_argv[0] ? saved_argv[0] : "skein", NULL, NULL};
	if (what) {
		snprintf(flag, sizeof flag, "%s%s", FAILED_FLAG, what);
		argv[1] = flag;
	}
	execv(path, argv);
	int e = errno;
	/* A broken installation: skein-cni is not next to skein. */
	printf("{\n    \"cniVersion\": \"1.1.0\",\n    \"code\": 11,\n"
	       "    \"msg\": \"skein: cannot run %s next to it (install both)\",\n"
	       "    \"details\": \"exec %s: %s\"\n}\n",
	       FALLBACK, path, strerror(e));
	return 1;
}

/* A JSON reader for one purpose: the top-level "socket" member of a
 * configuration that needs no care. It returns 1 and sets *val (not
 * terminated, *vlen bytes; NULL when there is no such member or it is
 * null) for an object whose member names are plain ASCII without escapes
 * and that has at most one member named "socket" in any case, a string
 * without escapes or bytes beyond ASCII, or null. For anything else,
 * including input that is not JSON, it returns 0 and skein-cni decides,
 * with encoding/json's rules (internal/cnirun/json.go). */
struct rd {
	const unsigned char *b;
	size_t n, i;
};

static void ws(struct rd *r)
{
	while (r->i < r->n && (r->b[r->i] == ' ' || r->b[r->i] == '\t' ||
			       r->b[r->i] == '\n' || r->b[r->i] == '\r'))
		r->i++;
}

static int hexd(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* str skips a string at r->i ('"'); plain is set when it has no escape
 * and no byte beyond ASCII. */
static int str(struct rd *r, int *plain)
{
	*plain = 1;
	r->i++;
	while (r->i < r->n) {
		unsigned char c = r->b[r->i++];
		if (c == '"')
			return 1;
		if (c < 0x20)
			return 0;
		if (c >= 0x80)
			*plain = 0;
		if (c == '\\') {
			*plain = 0;
			if (r->i >= r->n)
				return 0;
			c = r->b[r->i++];
			if (c == 'u') {
				for (int k = 0; k < 4; k++)
					if (r->i >= r->n || !hexd(r->b[r->i++]))
						return 0;
			} else if (!strchr("\"\\/bfnrt", c) || c == 0) {
				return 0;
			}
		}
	}
	return 0;
}

static int digits(struct rd *r)
{
	size_t s = r->i;
	while (r->i < r->n && r->b[r->i] >= '0' && r->b[r->i] <= '9')
		r->i++;
	return r->i > s;
}

/* value skips one value; depth bounds nesting (deeper: not ours). */
static int value(struct rd *r, int depth)
{
	int plain;
	if (depth > 64 || r->i >= r->n)
		return 0;
	unsigned char c = r->b[r->i];
	switch (c) {
	case '"':
		return str(r, &plain);
	case '{':
	case '[':
		r->i++;
		ws(r);
		if (r->i < r->n && r->b[r->i] == (c == '{' ? '}' : ']')) {
			r->i++;
			return 1;
		}
		for (;;) {
			if (c == '{') {
				if (r->i >= r->n || r->b[r->i] != '"' || !str(r, &plain))
					return 0;
				ws(r);
				if (r->i >= r->n || r->b[r->i++] != ':')
					return 0;
				ws(r);
			}
			if (!value(r, depth + 1))
				return 0;
			ws(r);
			if (r->i >= r->n)
				return 0;
			unsigned char d = r->b[r->i++];
			if (d == (c == '{' ? '}' : ']'))
				return 1;
			if (d != ',')
				return 0;
			ws(r);
		}
	case 't':
	case 'f':
	case 'n': {
		const char *w = c == 't' ? "true" : c == 'f' ? "false" : "null";
		size_t l = strlen(w);
		if (r->n - r->i < l || memcmp(r->b + r->i, w, l) != 0)
			return 0;
		r->i += l;
		return 1;
	}
	default:
		if (c == '-')
			r->i++;
		if (r->i < r->n && r->b[r->i] == '0')
			r->i++;
		else if (!digits(r))
			return 0;
		if (r->i < r->n && r->b[r->i] == '.') {
			r->i++;
			if (!digits(r))
				return 0;
		}
		if (r->i < r->n && (r->b[r->i] == 'e' || r->b[r->i] == 'E')) {
			r->i++;
			if (r->i < r->n && (r->b[r->i] == '+' || r->b[r->i] == '-'))
				r->i++;
			if (!digits(r))
				return 0;
		}
		return 1;
	}
}

static int find_socket(const char *data, size_t n, const char **val, size_t *vlen)
{
	struct rd r = {(const unsigned char *)data, n, 0};
	int plain, seen = 0;
	*val = NULL;
	*vlen = 0;
	ws(&r);
	if (r.i >= r.n || r.b[r.i] != '{')
		return 0;
	r.i++;
	ws(&r);
	if (r.i < r.n && r.b[r.i] == '}') {
		r.i++;
		goto end;
	}
	for (;;) {
		if (r.i >= r.n || r.b[r.i] != '"')
			return 0;
		size_t name = r.i + 1;
		if (!str(&r, &plain) || !plain)
			return 0;
		size_t namelen = r.i - 1 - name;
		ws(&r);
		if (r.i >= r.n || r.b[r.i++] != ':')
			return 0;
		ws(&r);
		size_t start = r.i;
		if (namelen == 6 && strncasecmp(data + name, "socket", 6) == 0) {
			if (seen++)
				return 0;
			if (r.i < r.n && r.b[r.i] == '"') {
				if (!str(&r, &plain) || !plain)
					return 0;
				*val = data + start + 1;
				*vlen = r.i - start - 2;
			} else if (r.n - r.i >= 4 && memcmp(r.b + r.i, "null", 4) == 0) {
				r.i += 4;
			} else {
				return 0;
			}
		} else if (!value(&r, 1)) {
			return 0;
		}
		ws(&r);
		if (r.i >= r.n)
			return 0;
		unsigned char d = r.b[r.i++];
		if (d == '}')
			break;
		if (d != ',')
			return 0;
		ws(&r);
	}
end:
	ws(&r);
	return r.i == r.n;
}

/* The request frame (internal/cnirun's AppendRequest). */
struct buf {
	char *p;
	size_t n, cap;
};

static int grow(struct buf *b, size_t more)
{
	if (b->n + more <= b->cap)
		return 1;
	size_t c = b->cap ? b->cap : 4096;
	while (c < b->n + more)
		c *= 2;
	char *p = realloc(b->p, c);
	if (!p)
		return 0;
	b->p = p;
	b->cap = c;
	return 1;
}

static void put(struct buf *b, const void *p, size_t n)
{
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void be(struct buf *b, uint64_t v, int bytes)
{
	for (int k = bytes - 1; k >= 0; k--)
		b->p[b->n++] = (char)(v >> (8 * k));
}

static void nsid(struct buf *b, const char *path)
{
	struct stat st;
	if (!path || stat(path, &st) != 0)
		st.st_dev = st.st_ino = 0;
	be(b, st.st_dev, 8);
	be(b, st.st_ino, 8);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* wait_fd waits for fd to be ready for events (a runtime may hand over a
 * non-blocking pipe); it returns 0 when it is, -1 on a poll error. */
static int wait_fd(int fd, short events)
{
	struct pollfd p = {.fd = fd, .events = events};
	int rc;
	do
		rc = poll(&p, 1, -1);
	while (rc < 0 && errno == EINTR);
	return rc < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	(void)argc;
	saved_argv = argv;
	/* A closed standard descriptor would be taken by the socket below
	 * (and the answer written back into it): /dev/null on each, as Go's
	 * runtime does for skein-cni. */
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF)
			if (open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd)
				return 1;
	const char *cmd = getenv("CNI_COMMAND");
	int known = 0;
	for (size_t k = 0; cmd && k < sizeof verbs / sizeof verbs[0]; k++)
		known |= strcmp(cmd, verbs[k]) == 0;
	if (!known)
		return fallback(NULL, 0, 0, NULL);

	/* stdin, whole, as skein-cni reads it (too long is its to say). */
	struct buf in = {0};
	for (;;) {
		if (!grow(&in, 65536))
			return fallback(in.p, in.n, 1, NULL);
		ssize_t r = read(0, in.p + in.n, in.cap - in.n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN && wait_fd(0, POLLIN) == 0)
			continue;
		if (r < 0 && in.n == 0)
			return fallback(NULL, 0, 0, NULL); /* skein-cni reads it and says why */
		if (r < 0) {
			/* Part of it read: skein-cni would not see it. */
			snprintf(what_buf, sizeof what_buf, "stdin:%d", errno);
			return fallback(in.p, in.n, 1, what_buf);
		}
		if (r == 0)
			break;
		in.n += (size_t)r;
	}
	if (in.n > MAX_STDIN)
		return fallback(in.p, in.n, 1, NULL);

	const char *sockv;
	size_t sockn;
	if (!find_socket(in.p ? in.p : "", in.n, &sockv, &sockn))
		return fallback(in.p, in.n, 1, NULL);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const char *env = getenv("SKEIN_SOCKET");
	if (!sockv || sockn == 0) {
		sockv = env && *env ? env : DEFAULT_SOCKET;
		sockn = strlen(sockv);
	}
	/* Too long, or abstract ('@', as Go spells it): skein-cni's. */
	if (sockn >= sizeof sa.sun_path || memchr(sockv, 0, sockn) || sockv[0] == '@')
		return fallback(in.p, in.n, 1, NULL);
	memcpy(sa.sun_path, sockv, sockn);

	/* The frame. */
	struct buf req = {0};
	size_t need = sizeof REQUEST_MAGIC + 4 + 32 + 2 + sizeof SERVICE + 2 + 4 + in.n;
	const char *vals[NENV];
	for (size_t k = 0; k < NENV; k++) {
		vals[k] = getenv(env_names[k]);
		if (vals[k] && *vals[k]) {
			size_t l = strlen(env_names[k]) + 1 + strlen(vals[k]);
			if (l > 0xffff)
				return fallback(in.p, in.n, 1, NULL);
			need += 2 + l;
		}
	}
	if (!grow(&req, need))
		return fallback(in.p, in.n, 1, NULL);
	put(&req, REQUEST_MAGIC, sizeof REQUEST_MAGIC - 1);
	be(&req, CALL_TIMEOUT_MS, 4);
	nsid(&req, "/proc/thread-self/ns/net");
	nsid(&req, vals[2] && *vals[2] ? vals[2] : NULL);
	be(&req, sizeof SERVICE - 1, 2);
	put(&req, SERVICE, sizeof SERVICE - 1);
	uint16_t count = 0;
	for (size_t k = 0; k < NENV; k++)
		count += vals[k] && *vals[k];
	be(&req, count, 2);
	for (size_t k = 0; k < NENV; k++) {
		if (!vals[k] || !*vals[k])
			continue;
		size_t nl = strlen(env_names[k]), vl = strlen(vals[k]);
		be(&req, nl + 1 + vl, 2);
		put(&req, env_names[k], nl);
		put(&req, "=", 1);
		put(&req, vals[k], vl);
	}
	be(&req, in.n, 4);
	put(&req, in.p, in.n);

	/* The call: a refused connect sent nothing, so skein-cni may try. */
	int64_t deadline = now_ms() + CALL_TIMEOUT_MS + CALL_GRACE_MS;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fallback(in.p, in.n, 1, NULL);
	struct timeval tv = {.tv_sec = (CALL_TIMEOUT_MS + CALL_GRACE_MS) / 1000};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int rc;
	do
		rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	while (rc != 0 && errno == EINTR);
	if (rc != 0)
		return fallback(in.p, in.n, 1, NULL);
	for (size_t off = 0; off < req.n;) {
		ssize_t w = send(fd, req.p + off, req.n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			/* Not sent whole, so never run: skein-cni may try. */
			return fallback(in.p, in.n, 1, NULL);
		}
		off += (size_t)w;
	}

	/* The answer, to its end. */
	struct buf out = {0};
	char what[32];
	for (;;) {
		if (!grow(&out, 4096))
			return fallback(in.p, in.n, 1, "nomem");
		int64_t left = deadline - now_ms();
		struct pollfd p = {.fd = fd, .events = POLLIN};
		rc = left > 0 ? poll(&p, 1, (int)left) : 0;
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc == 0)
			return fallback(in.p, in.n, 1, "timeout");
		ssize_t r = rc < 0 ? -1 : read(fd, out.p + out.n, out.cap - out.n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			if (e == ECONNRESET && out.n == 0)
				return fallback(in.p, in.n, 1, "noanswer");
			if (e == ECONNRESET && memcmp(out.p, REPLY_MAGIC, out.n < 12 ? out.n : 12) != 0)
				return fallback(in.p, in.n, 1, "frame");
			snprintf(what, sizeof what, "errno:%d", e);
			return fallback(in.p, in.n, 1, what);
		}
		if (r == 0)
			break;
		out.n += (size_t)r;
		if (out.n > MAX_STDOUT + sizeof REPLY_MAGIC - 1 + 5)
			return fallback(in.p, in.n, 1, "frame");
	}
	if (out.n == 0)
		return fallback(in.p, in.n, 1, "noanswer");
	const size_t m = sizeof REPLY_MAGIC - 1;
	if (out.n < m + 5 || memcmp(out.p, REPLY_MAGIC, m) != 0)
		return fallback(in.p, in.n, 1, "frame");
	const unsigned char *h = (const unsigned char *)out.p + m;
	uint32_t len = (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
	if ((uint64_t)len != out.n - m - 5)
		return fallback(in.p, in.n, 1, "frame");
	for (size_t off = 0; off < len;) {
		ssize_t w = write(1, out.p + m + 5 + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN && wait_fd(1, POLLOUT) == 0)
			continue;
		if (w <= 0)
			return 1;
		off += (size_t)w;
	}
	return h[0];
}
