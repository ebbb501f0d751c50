/* rdma-core v60's RDMACM_1.4 calls, as an application meets them:
 * rdma_resolve_addrinfo, rdma_query_addrinfo and rdma_write_cm_event.
 *
 *   cm_addrinfo ADDR      ADDR is the address of the daemon's rxe0
 *
 * - rdma_write_cm_event: only RDMA_CM_EVENT_USER (else EINVAL, as is a
 *   NULL id); the event is on the channel when the call returns (poll
 *   says so), with the id, the status and the arg in param.arg; it wakes
 *   a thread blocked in rdma_get_cm_event; one not yet read moves with
 *   its id on rdma_migrate_id.
 * - rdma_resolve_addrinfo (DNS, the default): RDMA_CM_EVENT_ADDRINFO_RESOLVED
 *   with status 0, then rdma_query_addrinfo hands over the list once
 *   (ENOENT before and after; EBUSY for a second resolution before the
 *   query); a name that does not resolve fails the call itself (-1,
 *   errno EAI_NONAME as rdma-core sets it) and no event comes; RAI_SA is
 *   refused (EOPNOTSUPP with RAI_DNS or a node, or on a device: RoCE has
 *   no SA; EINVAL without a service or unbound); a synchronous id
 *   returns when the answer is there; an unqueried answer is freed with
 *   its id.
 *
 * Built against any <rdma/rdma_cma.h> (Debian 12's has none of this:
 * the declarations below are rdma-core v60's) and linked against our
 * librdmacm. Exit 0 and a last line "OK ..." on success; "FAIL: why" and
 * exit 1 else.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef RAI_SA
#define RAI_SA 0x00000010
#endif
#ifndef RAI_DNS /* <rdma/rdma_cma.h> of rdma-core before v60 */
#define RAI_DNS 0x00000020
#define RDMA_CM_EVENT_ADDRINFO_RESOLVED 16
#define RDMA_CM_EVENT_ADDRINFO_ERROR 17
#define RDMA_CM_EVENT_USER 18
int rdma_resolve_addrinfo(struct rdma_cm_id *id, const char *node, const char *service,
			  const struct rdma_addrinfo *hints);
int rdma_query_addrinfo(struct rdma_cm_id *id, struct rdma_addrinfo **info);
int rdma_write_cm_event(struct rdma_cm_id *id, enum rdma_cm_event_type event, int status,
			uint64_t arg);
#endif

#define USER ((enum rdma_cm_event_type)RDMA_CM_EVENT_USER)

static void fail(const char *why, int e)
{
	printf("FAIL: %s (%d %s)\n", why, e, strerror(e));
	exit(1);
}

/* The call failed with -1 and this errno. */
static void expect_err(const char *what, int ret, int want)
{
	char msg[200];
	if (ret != -1 || errno != want) {
		snprintf(msg, sizeof(msg), "%s: ret %d errno %d, want -1 errno %d", what, ret,
			 ret == -1 ? errno : 0, want);
		fail(msg, ret == -1 ? errno : 0);
	}
}

static uint64_t arg_of(struct rdma_cm_event *e)
{
	uint64_t arg;
	memcpy(&arg, &e->param, sizeof(arg)); /* param.arg in v60's header */
	return arg;
}

static void set_nonblocking(struct rdma_event_channel *ch, int on)
{
	int fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK))
		fail("fcntl", errno);
}

/* The next event, which must be `want` for `id` with `status`. */
static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch, struct rdma_cm_id *id,
					  int want, int status)
{
	struct rdma_cm_event *e;
	char msg[200];
	if (rdma_get_cm_event(ch, &e))
		fail("rdma_get_cm_event", errno);
	if ((int)e->event != want || e->id != id || e->listen_id || e->status != status) {
		snprintf(msg, sizeof(msg), "got %s (%d) status %d id %p, want %d status %d id %p",
			 rdma_event_str(e->event), e->event, e->status, (void *)e->id, want, status,
			 (void *)id);
		fail(msg, 0);
	}
	return e;
}

static void expect_no_event(struct rdma_event_channel *ch, const char *after)
{
	struct rdma_cm_event *e;
	char msg[200];
	set_nonblocking(ch, 1);
	if (!rdma_get_cm_event(ch, &e)) {
		snprintf(msg, sizeof(msg), "an event (%s) after %s", rdma_event_str(e->event),
			 after);
		fail(msg, 0);
	}
	if (errno != EAGAIN)
		fail("rdma_get_cm_event on an empty non-blocking channel: not EAGAIN", errno);
	set_nonblocking(ch, 0);
}

struct waiter {
	struct rdma_event_channel *ch;
	struct rdma_cm_event *e;
	int err;
};

static void *wait_event(void *p)
{
	struct waiter *w = p;
	w->err = rdma_get_cm_event(w->ch, &w->e) ? errno : 0;
	return NULL;
}

static void write_events(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	struct rdma_event_channel *ch2;
	struct rdma_cm_event *e;
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct waiter w = {.ch = ch};
	pthread_t t;

	expect_err("rdma_write_cm_event(NULL)", rdma_write_cm_event(NULL, USER, 0, 1), EINVAL);
	expect_err("rdma_write_cm_event(ESTABLISHED)",
		   rdma_write_cm_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, 1), EINVAL);
	expect_err("rdma_write_cm_event(ADDRINFO_RESOLVED)",
		   rdma_write_cm_event(id, (enum rdma_cm_event_type)RDMA_CM_EVENT_ADDRINFO_RESOLVED,
				       0, 1),
		   EINVAL);
	expect_err("rdma_write_cm_event(INTERNAL)",
		   rdma_write_cm_event(id, (enum rdma_cm_event_type)19, 0, 1), EINVAL);
	expect_no_event(ch, "refused rdma_write_cm_event calls");

	if (rdma_write_cm_event(id, USER, -42, 0x1122334455667788ULL))
		fail("rdma_write_cm_event", errno);
	if (poll(&p, 1, 0) != 1 || !(p.revents & POLLIN))
		fail("the channel is not readable when rdma_write_cm_event returns", errno);
	e = expect_event(ch, id, RDMA_CM_EVENT_USER, -42);
	if (arg_of(e) != 0x1122334455667788ULL)
		fail("param.arg of the USER event", 0);
	if (strcmp(rdma_event_str(e->event), "UNKNOWN EVENT"))
		fail("rdma_event_str(RDMA_CM_EVENT_USER) is not rdma-core's", 0);
	rdma_ack_cm_event(e);

	/* The use the man page names: wake a thread waiting on the channel. */
	if (pthread_create(&t, NULL, wait_event, &w))
		fail("pthread_create", errno);
	usleep(200 * 1000);
	if (rdma_write_cm_event(id, USER, 7, 99))
		fail("rdma_write_cm_event (wake)", errno);
	pthread_join(t, NULL);
	if (w.err)
		fail("rdma_get_cm_event in the thread", w.err);
	if ((int)w.e->event != RDMA_CM_EVENT_USER || w.e->status != 7 || arg_of(w.e) != 99)
		fail("the thread's event", 0);
	rdma_ack_cm_event(w.e);

	/* Written, not read, then the id moves: its event goes with it. */
	ch2 = rdma_create_event_channel();
	if (!ch2)
		fail("rdma_create_event_channel", errno);
	if (rdma_write_cm_event(id, USER, 0, 0xfeed))
		fail("rdma_write_cm_event (migrate)", errno);
	if (rdma_migrate_id(id, ch2))
		fail("rdma_migrate_id", errno);
	expect_no_event(ch, "rdma_migrate_id to another channel");
	e = expect_event(ch2, id, RDMA_CM_EVENT_USER, 0);
	if (arg_of(e) != 0xfeed)
		fail("param.arg after rdma_migrate_id", 0);
	rdma_ack_cm_event(e);
	if (rdma_migrate_id(id, ch))
		fail("rdma_migrate_id back", errno);
	rdma_destroy_event_channel(ch2);
}

/* The answer's destination is ADDR:7471; with `full`, the rest is what
 * a name gives (an RC connection over TCP's port space, active side). */
static void check_list(struct rdma_addrinfo *ai, const char *addr, int full)
{
	struct sockaddr_in *sin = (struct sockaddr_in *)ai->ai_dst_addr;
	char got[INET_ADDRSTRLEN] = "";
	if (!sin || ai->ai_dst_len != sizeof(*sin) || sin->sin_family != AF_INET)
		fail("no IPv4 destination in the answer", 0);
	inet_ntop(AF_INET, &sin->sin_addr, got, sizeof(got));
	if (strcmp(got, addr) || ntohs(sin->sin_port) != 7471 || ai->ai_port_space != RDMA_PS_TCP ||
	    (ai->ai_flags & RAI_PASSIVE) || ai->ai_src_addr ||
	    (full && (ai->ai_family != AF_INET || ai->ai_qp_type != IBV_QPT_RC))) {
		printf("answer: %s:%d family %d ps %#x qp_type %d flags %#x\n", got,
		       ntohs(sin->sin_port), ai->ai_family, ai->ai_port_space, ai->ai_qp_type,
		       ai->ai_flags);
		fail("the answer is not the one rdma_getaddrinfo gives", 0);
	}
}

static void resolve(struct rdma_event_channel *ch, struct rdma_cm_id *id, const char *addr)
{
	struct rdma_addrinfo hints = {.ai_flags = RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP};
	struct rdma_addrinfo *ai = NULL, *direct = NULL;
	struct rdma_cm_event *e;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(7471)};
	int ret;

	expect_err("rdma_query_addrinfo before a resolution", rdma_query_addrinfo(id, &ai), ENOENT);
	expect_err("rdma_query_addrinfo(NULL)", rdma_query_addrinfo(NULL, &ai), EINVAL);
	expect_err("rdma_query_addrinfo(id, NULL)", rdma_query_addrinfo(id, NULL), EINVAL);
	expect_err("rdma_resolve_addrinfo(NULL)", rdma_resolve_addrinfo(NULL, addr, "7471", &hints),
		   EINVAL);

	if (rdma_resolve_addrinfo(id, addr, "7471", &hints))
		fail("rdma_resolve_addrinfo", errno);
	expect_err("a second rdma_resolve_addrinfo before the query",
		   rdma_resolve_addrinfo(id, addr, "7471", &hints), EBUSY);
	e = expect_event(ch, id, RDMA_CM_EVENT_ADDRINFO_RESOLVED, 0);
	if (strcmp(rdma_event_str(e->event), "RDMA_CM_EVENT_ADDRINFO_RESOLVED") ||
	    strcmp(rdma_event_str((enum rdma_cm_event_type)RDMA_CM_EVENT_ADDRINFO_ERROR),
		   "RDMA_CM_EVENT_ADDRINFO_ERROR"))
		fail("rdma_event_str of the ADDRINFO events", 0);
	rdma_ack_cm_event(e);
	if (rdma_query_addrinfo(id, &ai))
		fail("rdma_query_addrinfo", errno);
	check_list(ai, addr, 1);
	/* The same as rdma_getaddrinfo's, field by field. */
	if (rdma_getaddrinfo(addr, "7471", &hints, &direct))
		fail("rdma_getaddrinfo", errno);
	if (direct->ai_flags != ai->ai_flags || direct->ai_dst_len != ai->ai_dst_len ||
	    memcmp(direct->ai_dst_addr, ai->ai_dst_addr, ai->ai_dst_len) || ai->ai_next)
		fail("rdma_query_addrinfo's answer differs from rdma_getaddrinfo's", 0);
	rdma_freeaddrinfo(direct);
	rdma_freeaddrinfo(ai);
	expect_err("rdma_query_addrinfo a second time", rdma_query_addrinfo(id, &ai), ENOENT);

	/* No node: the hints' destination, as rdma_getaddrinfo takes it. */
	inet_pton(AF_INET, addr, &sin.sin_addr);
	hints.ai_dst_addr = (struct sockaddr *)&sin;
	hints.ai_dst_len = sizeof(sin);
	if (rdma_resolve_addrinfo(id, NULL, NULL, &hints))
		fail("rdma_resolve_addrinfo (hints only)", errno);
	rdma_ack_cm_event(expect_event(ch, id, RDMA_CM_EVENT_ADDRINFO_RESOLVED, 0));
	if (rdma_query_addrinfo(id, &ai))
		fail("rdma_query_addrinfo (hints only)", errno);
	check_list(ai, addr, 0);
	rdma_freeaddrinfo(ai);
	hints.ai_dst_addr = NULL;
	hints.ai_dst_len = 0;

	/* A name that does not resolve: the call fails, no event. */
	ret = rdma_resolve_addrinfo(id, "no-such-host.invalid", "7471", &hints);
	expect_err("rdma_resolve_addrinfo of a name that does not resolve", ret, EAI_NONAME);
	expect_err("rdma_resolve_addrinfo(NULL, NULL, NULL)",
		   rdma_resolve_addrinfo(id, NULL, NULL, NULL), EINVAL);
	expect_err("rdma_query_addrinfo after a failed resolution", rdma_query_addrinfo(id, &ai),
		   ENOENT);
	expect_no_event(ch, "failed rdma_resolve_addrinfo calls");

	/* The IB SA: not on RoCE. */
	hints.ai_flags = RAI_SA | RAI_DNS;
	expect_err("RAI_SA | RAI_DNS", rdma_resolve_addrinfo(id, NULL, "1", &hints), EOPNOTSUPP);
	hints.ai_flags = RAI_SA;
	expect_err("RAI_SA with a node", rdma_resolve_addrinfo(id, addr, "1", &hints), EOPNOTSUPP);
	expect_err("RAI_SA without a service", rdma_resolve_addrinfo(id, NULL, NULL, &hints),
		   EINVAL);
	expect_err("RAI_SA, unbound id", rdma_resolve_addrinfo(id, NULL, "1", &hints), EINVAL);
	inet_pton(AF_INET, addr, &sin.sin_addr);
	sin.sin_port = 0;
	if (rdma_bind_addr(id, (struct sockaddr *)&sin))
		fail("rdma_bind_addr", errno);
	expect_err("RAI_SA on RoCE", rdma_resolve_addrinfo(id, NULL, "1", &hints), EOPNOTSUPP);
	expect_no_event(ch, "refused RAI_SA resolutions");

	/* After all these failures, a resolution works. */
	hints.ai_flags = RAI_NUMERICHOST;
	if (rdma_resolve_addrinfo(id, addr, "7471", &hints))
		fail("rdma_resolve_addrinfo after failures", errno);
	rdma_ack_cm_event(expect_event(ch, id, RDMA_CM_EVENT_ADDRINFO_RESOLVED, 0));
	/* ... and its answer, never queried, goes with the id. */
}

static void sync_id(const char *addr)
{
	struct rdma_addrinfo hints = {.ai_flags = RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP};
	struct rdma_addrinfo *ai = NULL;
	struct rdma_cm_id *id;

	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id (synchronous)", errno);
	if (rdma_resolve_addrinfo(id, addr, "7471", &hints))
		fail("rdma_resolve_addrinfo (synchronous)", errno);
	if (!id->event || (int)id->event->event != RDMA_CM_EVENT_ADDRINFO_RESOLVED)
		fail("a synchronous id's event is not ADDRINFO_RESOLVED", 0);
	if (rdma_query_addrinfo(id, &ai))
		fail("rdma_query_addrinfo (synchronous)", errno);
	check_list(ai, addr, 1);
	rdma_freeaddrinfo(ai);
	if (rdma_destroy_id(id))
		fail("rdma_destroy_id (synchronous)", errno);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2)
		fail("usage: cm_addrinfo ADDR", EINVAL);
	ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel", errno);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id", errno);
	write_events(ch, id);
	printf("write_cm_event ok\n");
	resolve(ch, id, argv[1]);
	printf("resolve_addrinfo ok\n");
	sync_id(argv[1]);
	if (rdma_destroy_id(id))
		fail("rdma_destroy_id", errno);
	rdma_destroy_event_channel(ch);
	printf("OK addrinfo and user events\n");
	return 0;
}
