/*
 * skein-sandbox-exec: the last step of a prepared sandbox init
 * (internal/kurma/sandbox/sandboxinit, "prepared start"). The Go init
 * builds the sandbox (mounts, pivot_root) and confines itself (limits,
 * capabilities, no_new_privs, seccomp), then execs this program through a
 * descriptor skeind handed it. This program waits for the call and execs
 * the plugin.
 *
 * Why a second program: exec waits for every other thread of the process
 * to exit and tears its address space down. A Go init has four or five
 * threads, and with eight calls at once on two cores each dying thread
 * waits for a turn on a CPU: the plugin's exec took 1–9 ms there
 * (docs/benchmarks/kurma.md). This program is single-threaded and small,
 * so the call's exec has nothing to wait for; the Go init's own exec into
 * it happens while the init is prepared, off the call's path.
 *
 * The descriptors, as the Go init leaves them:
 *   3  status: silent and closed by a successful exec, or why it failed
 *   4  the call (below), from skeind
 *   5  ready: this program writes "ready" and closes it once it waits
 *
 * The call is NUL-terminated fields (sandbox.encodeCall):
 *   "skein-call/1", path, argc, argc arguments, envc, envc variables,
 *   expc, expc times (path, device, inode) in decimal,
 * then "\ngo\n" (sandboxinit.GoMsg), then the pipe's end. Nothing at all
 * means skeind no longer needs this init: it exits quietly. The end
 * without the go is no go, as for the Go init. Each path in "expect" must
 * be the file skeind saw (sandboxinit.Spec.Expect), or the call fails
 * with sandboxinit.StaleView and skeind starts it another way.
 *
 * An exec failure is reported as "exec PATH: errno N"; skeind words the
 * number (sandbox.wordExecErrno).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STATUS_FD 3
#define CALL_FD 4
#define READY_FD 5
#define MAGIC "skein-call/1"
#define GO_MSG "\ngo\n"
#define STALE_VIEW "stale view of the host: "
#define MAX_CALL (4 << 20) /* sandbox.maxCall */

static void fail(const char *msg)
{
	size_t n = strlen(msg);
	while (n > 0) {
		ssize_t w = write(STATUS_FD, msg, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		msg += w;
		n -= (size_t)w;
	}
	_exit(127);
}

/* fields walks the NUL-terminated fields of the call. */
struct fields {
	char *p, *end;
};

static char *next(struct fields *f)
{
	if (f->p >= f->end)
		fail("read spec: the call ends early");
	char *s = f->p;
	char *z = memchr(s, '\0', (size_t)(f->end - s));
	if (z == NULL)
		fail("read spec: a field of the call is not terminated");
	f->p = z + 1;
	return s;
}

static unsigned long long number(struct fields *f, unsigned long long max)
{
	char *s = next(f), *e;
	if (*s < '0' || *s > '9')
		fail("read spec: a count of the call is not a number");
	errno = 0;
	unsigned long long v = strtoull(s, &e, 10);
	if (errno != 0 || *e != '\0' || v > max)
		fail("read spec: a count of the call is out of range");
	return v;
}

/* left bounds a count: every field takes one byte at least. */
static unsigned long long left(const struct fields *f)
{
	return (unsigned long long)(f->end - f->p);
}

static char **strings(struct fields *f, size_t n, size_t first)
{
	char **v = calloc(first + n + 1, sizeof *v);
	if (v == NULL)
		fail("read spec: out of memory");
	for (size_t i = 0; i < n; i++)
		v[first + i] = next(f);
	return v;
}

/* mark_cloexec leaves only 0, 1 and 2 open across the exec: the status
 * pipe closes when it succeeds, and nothing of skeind's reaches the
 * plugin. */
static void mark_cloexec(void)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) == 0)
		return;
#endif
	struct rlimit rl;
	long max = 1024;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1 << 20)
		max = (long)rl.rlim_cur;
	for (long fd = 3; fd < max; fd++)
		fcntl((int)fd, F_SETFD, FD_CLOEXEC);
}

int main(void)
{
	static const char ready[] = "ready";
	if (write(READY_FD, ready, sizeof ready - 1) != (ssize_t)(sizeof ready - 1))
		fail("report ready: short write");
	close(READY_FD);

	char *buf = malloc(MAX_CALL + 1);
	if (buf == NULL)
		fail("read spec: out of memory");
	size_t n = 0;
	for (;;) {
		ssize_t r = read(CALL_FD, buf + n, MAX_CALL + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			char msg[64];
			snprintf(msg, sizeof msg, "read spec: errno %d", errno);
			fail(msg);
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n > MAX_CALL)
			fail("read spec: the call is too long");
	}
	close(CALL_FD);
	if (n == 0)
		_exit(0);

	/* The call, then exactly the go. A call cut short fails as one
	 * without its go (the sandbox died, or called the start off). */
	size_t go = sizeof GO_MSG - 1;
	int has_go = n >= go && memcmp(buf + n - go, GO_MSG, go) == 0;
	struct fields f = {buf, has_go ? buf + n - go : buf + n};
	if (memchr(buf, '\0', n) == NULL || strcmp(buf, MAGIC) != 0) {
		if (!has_go)
			fail("the sandbox closed the call without a go");
		fail("read spec: not a call this init knows");
	}
	next(&f);
	char *path = next(&f);
	size_t argc = number(&f, left(&f));
	char **argv = strings(&f, argc, 1);
	argv[0] = path;
	size_t envc = number(&f, left(&f));
	char **envp = strings(&f, envc, 0);
	size_t expc = number(&f, left(&f) / 3);
	char **exp = strings(&f, 3 * expc, 0);
	if (f.p != f.end) {
		if (!has_go)
			fail("read spec: something after the spec, want the go");
		fail("read spec: more after the call's last field");
	}
	if (!has_go)
		fail("the sandbox closed the call without a go");
	for (size_t i = 0; i < expc; i++) {
		char *p = exp[3 * i], *e;
		errno = 0;
		unsigned long long dev = strtoull(exp[3 * i + 1], &e, 10);
		int bad = errno != 0 || *e != '\0' || *exp[3 * i + 1] < '0' || *exp[3 * i + 1] > '9';
		unsigned long long ino = strtoull(exp[3 * i + 2], &e, 10);
		bad = bad || errno != 0 || *e != '\0' || *exp[3 * i + 2] < '0' || *exp[3 * i + 2] > '9';
		if (bad)
			fail("read spec: a file's device or inode is not a number");
		struct stat st;
		static char msg[4200];
		if (stat(p, &st) != 0) {
			snprintf(msg, sizeof msg, "%s%.4000s: errno %d", STALE_VIEW, p, errno);
			fail(msg);
		}
		if ((unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino) {
			snprintf(msg, sizeof msg, "%s%.4000s is another file here", STALE_VIEW, p);
			fail(msg);
		}
	}

	umask(022);
	mark_cloexec();
	execve(path, argv, envp);
	static char msg[4200];
	snprintf(msg, sizeof msg, "exec %.4000s: errno %d", path, errno);
	fail(msg);
}
