/* Helpers shared by the C test programs: checks that print "FAIL line N"
 * and exit 1, polling one completion, connecting an RC QP to a QP of the
 * same device, and posting one signaled RDMA work request. */
#ifndef RXE_EMU_TEST_UTIL_H
#define RXE_EMU_TEST_UTIL_H
#include <errno.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			printf("FAIL line %d: ", __LINE__);                \
			printf(__VA_ARGS__);                               \
			printf(" (errno %d)\n", errno);                    \
			exit(1);                                           \
		}                                                          \
	} while (0)
#define EXPECT_NULL_ERRNO(expr, e)                                         \
	do {                                                               \
		errno = 0;                                                 \
		void *p_ = (void *)(expr);                                 \
		CHECK(p_ == NULL && errno == (e), "%s: want NULL/%s", #expr, #e); \
	} while (0)
#define EXPECT_RC(expr, e)                                                 \
	do {                                                               \
		int rc_ = (expr);                                          \
		CHECK(rc_ == (e), "%s = %d, want %s", #expr, rc_, #e);     \
	} while (0)

static inline struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000L; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return wc;
	}
	CHECK(0, "no completion");
	return wc;
}

/* Move an RC QP to RTS towards `dest` with the given qp_access_flags. */
static inline void connect_qp_access(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid,
				     unsigned int access)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	EXPECT_RC(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	EXPECT_RC(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	EXPECT_RC(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					       IBV_QP_MAX_QP_RD_ATOMIC), 0);
}

static inline void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	connect_qp_access(qp, dest, gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

/* Post one signaled RDMA WRITE or READ (`op`) of `len` bytes between
 * laddr (lkey) and raddr (rkey), as work request `wr_id`. */
static inline void post_rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id,
			     uint32_t lkey, uint64_t laddr, uint32_t len, uint32_t rkey,
			     uint64_t raddr)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = raddr;
	EXPECT_RC(ibv_post_send(qp, &wr, &bad), 0);
}

static inline struct ibv_wc rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
			  uint32_t lkey, uint64_t laddr, uint32_t len, uint32_t rkey,
			  uint64_t raddr)
{
	post_rdma(qp, op, 7, lkey, laddr, len, rkey, raddr);
	return poll1(cq);
}

/* Spin on memory (no library call) until `len` bytes at `p` equal `want`;
 * 10 s at most. */
static inline int arrives(const volatile void *p, const void *want, size_t len)
{
	const volatile unsigned char *got = p;
	const unsigned char *w = want;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		size_t i = 0;
		while (i < len && got[i] == w[i])
			i++;
		if (i == len)
			return 1;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			return 0;
	}
}

static inline void put(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n, "pipe write");
}

static inline void get(int fd, void *p, size_t n)
{
	CHECK(read(fd, p, n) == (ssize_t)n, "pipe read");
}

/* One of two processes of the device (A, the parent, and B, its child),
 * each with a PD, a CQ and an RC QP, and a pipe each way to the other. */
struct side {
	int is_b;
	pid_t b_pid;
	int in, out; /* from and to the other process */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

/* Fork B and open the device in both; returns in each process. Each side's
 * reads end when the other exits. */
static inline struct side two_processes(void)
{
	struct side s = {0};
	int a2b[2], b2a[2];
	CHECK(pipe(a2b) == 0 && pipe(b2a) == 0, "pipe");
	s.b_pid = fork();
	CHECK(s.b_pid >= 0, "fork");
	s.is_b = s.b_pid == 0;
	s.in = s.is_b ? a2b[0] : b2a[0];
	s.out = s.is_b ? b2a[1] : a2b[1];
	close(s.is_b ? a2b[1] : b2a[1]);
	close(s.is_b ? b2a[0] : a2b[0]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	s.ctx = ibv_open_device(list[0]);
	CHECK(s.ctx, "open_device");
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 16, NULL, NULL, 0);
	CHECK(s.pd && s.cq, "pd, cq");
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	ia.send_cq = ia.recv_cq = s.cq;
	s.qp = ibv_create_qp(s.pd, &ia);
	CHECK(s.qp, "create_qp");
	EXPECT_RC(ibv_query_gid(s.ctx, 1, 1, &s.gid), 0);
	return s;
}

/* What each side tells the other: its QP, and an MR of it (B's). */
struct peer_info {
	uint32_t qpn, rkey;
	uint64_t addr;
};

/* Tell the other side `rkey` and `addr` (0 if none), learn its, connect
 * the QP to its QP, and wait until it has connected too. */
static inline struct peer_info meet(const struct side *s, uint32_t rkey, uint64_t addr)
{
	struct peer_info me = {.qpn = s->qp->qp_num, .rkey = rkey, .addr = addr}, peer;
	put(s->out, &me, sizeof(me));
	get(s->in, &peer, sizeof(peer));
	union ibv_gid gid = s->gid;
	connect_qp(s->qp, peer.qpn, &gid);
	char c = 0;
	put(s->out, &c, 1);
	get(s->in, &c, 1);
	return peer;
}

/* `name`'s value on the STAT line of `slot` (the daemon's control
 * socket, RXE_EMU_SOCKET: one request line, the reply until it closes). */
static inline long stat_value(int slot, const char *name)
{
	const char *path = getenv("RXE_EMU_SOCKET");
	CHECK(path, "RXE_EMU_SOCKET is not set");
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(fd >= 0, "socket");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s", path);
	const char *q = "STAT rxe0\n";
	CHECK(write(fd, q, strlen(q)) == (ssize_t)strlen(q), "write");
	static char reply[1 << 16];
	size_t n = 0;
	ssize_t r;
	while (n < sizeof(reply) - 1 && (r = read(fd, reply + n, sizeof(reply) - 1 - n)) > 0)
		n += r;
	close(fd);
	reply[n] = 0;
	char head[32];
	snprintf(head, sizeof(head), "slot %d ", slot);
	for (char *line = strtok(reply, "\n"); line; line = strtok(NULL, "\n")) {
		while (*line == ' ')
			line++;
		if (strncmp(line, head, strlen(head)) != 0)
			continue;
		char want[64];
		snprintf(want, sizeof(want), " %s ", name);
		char *at = strstr(line, want);
		CHECK(at, "no %s on slot %d's line: %s", name, slot, line);
		return strtol(at + strlen(want), NULL, 10);
	}
	CHECK(0, "no slot %d in the STAT reply", slot);
	return 0;
}

#endif
