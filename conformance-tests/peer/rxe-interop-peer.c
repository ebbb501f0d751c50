/*
 * rxe-interop-peer: one side of an interop test between two RDMA devices
 * (kernel rxe in the guest, rxe-emu through its drop-in libibverbs.so.1 on
 * the host). The same binary runs on both, linked against Debian 12's
 * libibverbs.
 *
 * The server (no HOST argument) is the responder, the client the requester.
 * They exchange QPN, PSN, GID, rkey and address over TCP, then run one
 * operation over a list of sizes, stepping together over TCP:
 *
 *   responder: prepare (fill, post receive) -> "R i"
 *   requester: post the WR, poll, check its completion (and data for READ
 *              and atomics) -> "D i"
 *   responder: check the receive completion and every byte it can see
 *              (including guard bytes around the target that must not move)
 *
 * Every check failure prints "FAIL ..." and the exit code is 1. The last
 * line of a successful run is
 *   "PEER-OK op=OP role=ROLE msgs=N bytes=B verified=V"
 * where V counts the bytes this side compared (0 only where this side sees
 * no data: the requester of SEND/WRITE). Error modes print their measured
 * outcome ("RNR ...", "ACCESS ...", "VANISH ...") before PEER-OK.
 *
 * Build: cc -O2 -Wall -o rxe-interop-peer rxe-interop-peer.c -libverbs
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum op {
	OP_SEND, OP_SEND_IMM, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_CAS, OP_FAA,
	OP_SRQ_SEND, OP_UC_SEND, OP_UC_WRITE, OP_UD_SEND,
	OP_RNR, OP_BAD_RKEY, OP_VANISH, OP_FLUSH, OP_ATOMIC_WRITE,
};
static const char *op_names[] = {
	"send", "send-imm", "write", "write-imm", "read", "cas", "faa",
	"srq-send", "uc-send", "uc-write", "ud-send",
	"rnr", "bad-rkey", "vanish", "flush", "atomic-write", NULL,
};

/*
 * FLUSH (rdma-core 45, kernel rxe 6.2): built against Debian 12's
 * rdma-core 44 headers, which have ATOMIC WRITE but not FLUSH, so FLUSH's
 * numbers and the function pointer rdma-core 45 appended to struct
 * ibv_qp_ex are spelled out here. FLUSH runs only where the library has
 * it (rdma-core >= 45: Debian 13's and sid's in the guest, our drop-in on
 * the host); the suite runs neither FLUSH nor ATOMIC WRITE against
 * Linux 6.1, whose rxe has neither.
 */
struct qp_ex45 {
	struct ibv_qp_ex base;
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
};
_Static_assert(sizeof(struct ibv_qp_ex) ==
		       offsetof(struct ibv_qp_ex, wr_atomic_write) + sizeof(void (*)(void)),
	       "built against rdma-core >= 45 headers: use their wr_flush");
#define QP_EX_WITH_FLUSH (1ull << 11)
#define ACCESS_FLUSH_GLOBAL (1 << 8)
#define WC_FLUSH 8
#define FLUSH_GLOBAL 1
#define FLUSH_RANGE 0
#define FLUSH_MR 1

#define GUARD 64	/* guard bytes each side of a target region */
#define FILL 0xa5	/* what untouched memory holds */
#define UD_GRH 40
#define QKEY 0x11111111
#define POLL_SECS 30

static struct {
	const char *dev, *host, *sizes;
	int port, gid_idx, mtu, is_server;
	enum op op;
	int rnr_delay_ms, min_rnr_timer, rnr_retry;
	int timeout, retry_cnt;
	int atomics, linger_ms;
} o = {
	.dev = "rxe0", .port = 18600, .gid_idx = 1, .mtu = 1024,
	.sizes = "1,2,63,1023,1024,1025,4095,4096,4097,65536,1048576",
	.rnr_delay_ms = 300, .min_rnr_timer = 20, .rnr_retry = 7,
	.timeout = 14, .retry_cnt = 7, .atomics = 16,
};

static const char *role;
static int failures;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "FAIL %s: ", role ? role : "peer");
	vfprintf(stdout, fmt, ap);
	fprintf(stdout, "\n");
	fflush(stdout);
	va_end(ap);
	exit(1);
}

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (failures < 20) {
		fprintf(stdout, "FAIL %s: ", role);
		vfprintf(stdout, fmt, ap);
		fprintf(stdout, "\n");
	}
	va_end(ap);
	failures++;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The byte at position i of message idx: differs between messages, not
 * periodic in 256, so a misplaced or repeated packet shows. */
static uint8_t pat(size_t i, unsigned idx, unsigned salt)
{
	uint32_t x = (uint32_t)i * 2654435761u + idx * 40503u + salt * 97u;
	return (uint8_t)((x >> 24) ^ (i >> 10) ^ idx);
}

static void fill_pat(uint8_t *p, size_t n, unsigned idx, unsigned salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pat(i, idx, salt);
}

static int pat_matches(const volatile uint8_t *p, size_t n, unsigned idx, unsigned salt)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pat(i, idx, salt))
			return 0;
	return 1;
}

/* Compare n bytes at p with the pattern; count them as verified. */
static long long verified;
static int check_pat(const char *what, const uint8_t *p, size_t n, unsigned idx, unsigned salt)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pat(i, idx, salt)) {
			fail("%s message %u: byte %zu of %zu is 0x%02x, want 0x%02x", what, idx, i, n,
			     p[i], pat(i, idx, salt));
			return -1;
		}
	verified += n;
	return 0;
}

static int check_fill(const char *what, const uint8_t *p, size_t n, unsigned idx)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != FILL) {
			fail("%s message %u: guard byte %zu is 0x%02x, want 0x%02x (written outside the target)",
			     what, idx, i, p[i], FILL);
			return -1;
		}
	verified += n;
	return 0;
}

/* ------------------------------------------------------------------ TCP */
static int sock = -1;
static FILE *sin_, *sout;

static void tcp_connect(void)
{
	char port[16];
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	snprintf(port, sizeof port, "%d", o.port);
	if (o.is_server) {
		hints.ai_flags = AI_PASSIVE;
		if (getaddrinfo(NULL, port, &hints, &res))
			die("getaddrinfo");
		int l = socket(res->ai_family, res->ai_socktype, 0), one = 1;
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, res->ai_addr, res->ai_addrlen) || listen(l, 1))
			die("cannot listen on TCP port %d: %s", o.port, strerror(errno));
		sock = accept(l, NULL, NULL);
		close(l);
	} else {
		if (getaddrinfo(o.host, port, &hints, &res))
			die("cannot resolve %s", o.host);
		double t0 = now_s();
		for (;;) {
			sock = socket(res->ai_family, res->ai_socktype, 0);
			if (!connect(sock, res->ai_addr, res->ai_addrlen))
				break;
			close(sock);
			if (now_s() - t0 > 20)
				die("cannot connect to %s:%d: %s", o.host, o.port, strerror(errno));
			usleep(100000);
		}
	}
	freeaddrinfo(res);
	if (sock < 0)
		die("TCP: %s", strerror(errno));
	sin_ = fdopen(sock, "r");
	sout = fdopen(dup(sock), "w");
}

static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(sout, fmt, ap);
	va_end(ap);
	fputc('\n', sout);
	fflush(sout);
}

static void hear(char *buf, size_t n)
{
	if (!fgets(buf, n, sin_))
		die("peer closed the TCP connection");
}

static void expect(char tag, unsigned idx)
{
	char b[128];
	char t;
	unsigned i;
	hear(b, sizeof b);
	if (sscanf(b, "%c %u", &t, &i) != 2 || t != tag || i != idx)
		die("TCP step: got \"%.40s\", want \"%c %u\"", b, tag, idx);
}

/* ---------------------------------------------------------------- verbs */
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static struct ibv_cq *scq, *rcq;
static struct ibv_srq *srq;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static uint8_t *buf;
static size_t buf_len;

struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};
static struct dest me, peer;

static int is_ud(void) { return o.op == OP_UD_SEND; }
static int is_v45(void) { return o.op == OP_FLUSH || o.op == OP_ATOMIC_WRITE; }
static int is_uc(void) { return o.op == OP_UC_SEND || o.op == OP_UC_WRITE; }
static const char *wc_str(enum ibv_wc_status s) { return ibv_wc_status_str(s); }

static void setup(size_t max)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n), *d = NULL;
	if (!l)
		die("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), o.dev))
			d = l[i];
	if (!d)
		die("no device %s", o.dev);
	ctx = ibv_open_device(d);
	if (!ctx)
		die("ibv_open_device %s", o.dev);
	pd = ibv_alloc_pd(ctx);
	buf_len = max + 2 * GUARD + 256 + UD_GRH;
	buf = aligned_alloc(4096, (buf_len + 4095) & ~4095ul);
	memset(buf, FILL, buf_len);
	mr = ibv_reg_mr(pd, buf, buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC |
				(o.op == OP_FLUSH ? ACCESS_FLUSH_GLOBAL : 0));
	if (!pd || !buf || !mr)
		die("pd/mr: %s", strerror(errno));
	scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!scq || !rcq)
		die("ibv_create_cq: %s", strerror(errno));
	if (o.op == OP_SRQ_SEND && o.is_server) {
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
		srq = ibv_create_srq(pd, &sa);
		if (!srq)
			die("ibv_create_srq: %s", strerror(errno));
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = is_ud() ? IBV_QPT_UD : is_uc() ? IBV_QPT_UC : IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	if (is_v45()) {
		struct ibv_qp_init_attr_ex ix = {
			.send_cq = scq, .recv_cq = rcq, .cap = ia.cap, .qp_type = IBV_QPT_RC,
			.sq_sig_all = 1, .pd = pd,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE |
					  (o.op == OP_FLUSH ? QP_EX_WITH_FLUSH : IBV_QP_EX_WITH_ATOMIC_WRITE),
		};
		qp = ibv_create_qp_ex(ctx, &ix);
	} else {
		qp = ibv_create_qp(pd, &ia);
	}
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (is_ud()) {
		a.qkey = QKEY;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				    (is_uc() ? 0 : IBV_ACCESS_REMOTE_ATOMIC) |
				    (o.op == OP_FLUSH ? ACCESS_FLUSH_GLOBAL : 0);
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify_qp INIT: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, o.gid_idx, &me.gid))
		die("ibv_query_gid %d", o.gid_idx);
	srand48(getpid() ^ (long)(now_s() * 1e6));
	me.qpn = qp->qp_num;
	me.psn = lrand48() & 0xffffff;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)buf;
}

static void exchange(void)
{
	char gid[33], line[256];
	for (int i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", me.gid.raw[i]);
	say("%06x:%06x:%08x:%016llx:%s", me.qpn, me.psn, me.rkey, (unsigned long long)me.addr, gid);
	hear(line, sizeof line);
	unsigned long long addr;
	if (sscanf(line, "%x:%x:%x:%llx:%32s", &peer.qpn, &peer.psn, &peer.rkey, &addr, gid) != 5 ||
	    strlen(gid) != 32)
		die("bad address line from the peer: %s", line);
	peer.addr = addr;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(gid + 2 * i, "%2x", &v);
		peer.gid.raw[i] = v;
	}
	printf("local qpn 0x%06x psn 0x%06x rkey 0x%08x, remote qpn 0x%06x psn 0x%06x rkey 0x%08x\n",
	       me.qpn, me.psn, me.rkey, peer.qpn, peer.psn, peer.rkey);
}

static void connect_qp(void)
{
	struct ibv_ah_attr aha = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = peer.gid, .sgid_index = o.gid_idx, .hop_limit = 1 },
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int mask = IBV_QP_STATE;
	if (is_ud()) {
		ah = ibv_create_ah(pd, &aha);
		if (!ah)
			die("ibv_create_ah: %s", strerror(errno));
	} else {
		a.path_mtu = o.mtu == 4096 ? IBV_MTU_4096 : o.mtu == 2048 ? IBV_MTU_2048 :
			     o.mtu == 512 ? IBV_MTU_512 : o.mtu == 256 ? IBV_MTU_256 : IBV_MTU_1024;
		a.dest_qp_num = peer.qpn;
		a.rq_psn = peer.psn;
		a.ah_attr = aha;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (!is_uc()) {
			a.max_dest_rd_atomic = 4;
			a.min_rnr_timer = o.min_rnr_timer;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify_qp RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me.psn;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (!is_ud() && !is_uc()) {
		a.timeout = o.timeout;
		a.retry_cnt = o.retry_cnt;
		a.rnr_retry = o.rnr_retry;
		a.max_rd_atomic = 4;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify_qp RTS: %s", strerror(errno));
}

/* One completion from cq within POLL_SECS. */
static struct ibv_wc poll1(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double t0 = now_s();
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq failed (%s)", what);
		if (n == 1)
			return wc;
		if (now_s() - t0 > POLL_SECS)
			die("no %s completion within %d s", what, POLL_SECS);
	}
}

static void post_recv(uint8_t *at, size_t len, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)at, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int rc = srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
	if (rc)
		die("post_recv: %s", strerror(rc));
}

/* Offsets that move around, so placement is checked off page boundaries. */
static size_t loc_off(unsigned idx) { return GUARD + (idx * 5) % 31; }
static size_t rem_off(unsigned idx) { return GUARD + (idx * 13) % 61; }
static uint32_t imm_of(unsigned idx) { return 0x5eed0000u ^ (idx * 0x01010101u); }

static size_t sizes[64];
static unsigned nsizes;

static void parse_sizes(void)
{
	char *s = strdup(o.sizes), *tok, *save;
	for (tok = strtok_r(s, ",", &save); tok && nsizes < 64; tok = strtok_r(NULL, ",", &save))
		sizes[nsizes++] = strtoul(tok, NULL, 0);
	if (!nsizes)
		die("no sizes");
}

static unsigned salt(void) { return (unsigned)o.op * 31 + 7; }

/* What ATOMIC WRITE k of message idx writes. */
static uint64_t aw_value(unsigned idx, unsigned k)
{
	return 0x0123456789abcdefull * (k + 3) ^ ((uint64_t)idx << 48);
}

/* --------------------------------------------------------------- data ops */
static long long total_bytes;

static void responder_msg(unsigned idx, size_t size)
{
	size_t off = rem_off(idx);
	int recv = o.op == OP_SEND || o.op == OP_SEND_IMM || o.op == OP_WRITE_IMM ||
		   o.op == OP_SRQ_SEND || o.op == OP_UC_SEND || o.op == OP_UD_SEND;
	memset(buf, FILL, buf_len);
	if (o.op == OP_READ)
		fill_pat(buf + off, size, idx, salt());
	if (o.op == OP_CAS || o.op == OP_FAA)
		for (unsigned k = 0; k < (unsigned)o.atomics; k++) {
			uint64_t v = 0x0101010101010101ull * (k + 1) ^ ((uint64_t)idx << 40);
			memcpy(buf + GUARD + 8 * k, &v, 8);
		}
	if (recv) {
		if (is_ud())
			post_recv(buf + off, size + UD_GRH, idx);
		else
			post_recv(buf + off, size, idx);
	}
	say("R %u", idx);
	expect('D', idx);
	if (recv) {
		struct ibv_wc wc = poll1(rcq, "receive");
		enum ibv_wc_opcode want = o.op == OP_WRITE_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		uint32_t want_len = size + (is_ud() ? UD_GRH : 0);
		int imm = o.op == OP_SEND_IMM || o.op == OP_WRITE_IMM;
		if (wc.status != IBV_WC_SUCCESS)
			fail("message %u: receive completion %s", idx, wc_str(wc.status));
		else {
			if (wc.wr_id != idx)
				fail("message %u: wr_id %llu", idx, (unsigned long long)wc.wr_id);
			if (wc.opcode != want)
				fail("message %u: wc opcode %d, want %d", idx, wc.opcode, want);
			if (wc.byte_len != want_len)
				fail("message %u: byte_len %u, want %u", idx, wc.byte_len, want_len);
			if (imm && !(wc.wc_flags & IBV_WC_WITH_IMM))
				fail("message %u: no IBV_WC_WITH_IMM", idx);
			if (!imm && (wc.wc_flags & IBV_WC_WITH_IMM))
				fail("message %u: unexpected IBV_WC_WITH_IMM", idx);
			if (imm && ntohl(wc.imm_data) != imm_of(idx))
				fail("message %u: immediate 0x%08x, want 0x%08x", idx, ntohl(wc.imm_data),
				     imm_of(idx));
			if (wc.qp_num != qp->qp_num)
				fail("message %u: wc qp_num 0x%x", idx, wc.qp_num);
			if (is_ud()) {
				if (!(wc.wc_flags & IBV_WC_GRH))
					fail("message %u: UD receive without IBV_WC_GRH", idx);
				if (wc.src_qp != peer.qpn)
					fail("message %u: src_qp 0x%x, want 0x%x", idx, wc.src_qp, peer.qpn);
			}
		}
	}
	if (o.op == OP_ATOMIC_WRITE) {
		for (unsigned k = 0; k < (unsigned)o.atomics; k++) {
			uint64_t v, want = aw_value(idx, k);
			memcpy(&v, buf + GUARD + 8 * k, 8);
			if (v != want)
				fail("message %u ATOMIC WRITE %u: memory 0x%016llx, want 0x%016llx", idx,
				     k, (unsigned long long)v, (unsigned long long)want);
			else
				verified += 8;
		}
		check_fill("after ATOMIC WRITEs", buf + GUARD + 8 * o.atomics, 64, idx);
		check_fill("before ATOMIC WRITEs", buf, GUARD, idx);
		size = 8 * o.atomics;
	} else if (o.op == OP_CAS || o.op == OP_FAA) {
		for (unsigned k = 0; k < (unsigned)o.atomics; k++) {
			uint64_t v, orig = 0x0101010101010101ull * (k + 1) ^ ((uint64_t)idx << 40), want;
			memcpy(&v, buf + GUARD + 8 * k, 8);
			if (o.op == OP_FAA)
				want = orig + 0x100000001ull * (k + 1);
			else
				want = (k & 1) ? orig : ~orig; /* odd k: compare mismatched */
			if (v != want)
				fail("message %u atomic %u: memory 0x%016llx, want 0x%016llx", idx, k,
				     (unsigned long long)v, (unsigned long long)want);
			else
				verified += 8;
		}
		check_fill("after atomics", buf + GUARD + 8 * o.atomics, 64, idx);
		check_fill("before atomics", buf, GUARD, idx);
		size = 8 * o.atomics;
	} else if (o.op == OP_READ) {
		check_pat("READ source (unchanged)", buf + off, size, idx, salt());
	} else {
		size_t data = off + (is_ud() ? UD_GRH : 0);
		/* UC WRITE: the requester's completion means sent, not placed;
		 * wait (up to 10 s) for the last byte to land, then check all. */
		double t0 = now_s();
		while (o.op == OP_UC_WRITE && !pat_matches(buf + data, size, idx, salt()) &&
		       now_s() - t0 < 10)
			usleep(1000);
		check_pat("received", buf + data, size, idx, salt());
		check_fill("before target", buf, off, idx);
		check_fill("after target", buf + data + size, GUARD, idx);
	}
	total_bytes += size;
}

static void requester_msg(unsigned idx, size_t size)
{
	size_t loff = loc_off(idx), roff = rem_off(idx);
	struct ibv_sge sge = { .addr = (uintptr_t)buf + loff, .length = size, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = idx, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	enum ibv_wc_opcode want;
	memset(buf, FILL, buf_len);
	if (o.op != OP_READ)
		fill_pat(buf + loff, size, idx, salt());
	wr.wr.rdma.remote_addr = peer.addr + roff;
	wr.wr.rdma.rkey = peer.rkey;
	switch (o.op) {
	case OP_SEND_IMM:
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.imm_data = htonl(imm_of(idx));
		want = IBV_WC_SEND;
		break;
	case OP_WRITE:
	case OP_UC_WRITE:
	case OP_FLUSH:
		wr.opcode = IBV_WR_RDMA_WRITE;
		want = IBV_WC_RDMA_WRITE;
		break;
	case OP_WRITE_IMM:
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.imm_data = htonl(imm_of(idx));
		want = IBV_WC_RDMA_WRITE;
		break;
	case OP_READ:
		wr.opcode = IBV_WR_RDMA_READ;
		want = IBV_WC_RDMA_READ;
		break;
	case OP_UD_SEND:
		wr.opcode = IBV_WR_SEND;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = peer.qpn;
		wr.wr.ud.remote_qkey = QKEY;
		want = IBV_WC_SEND;
		break;
	default:
		wr.opcode = IBV_WR_SEND;
		want = IBV_WC_SEND;
	}
	expect('R', idx);
	if (o.op == OP_ATOMIC_WRITE) {
		struct ibv_qp_ex *q = ibv_qp_to_qp_ex(qp);
		for (unsigned k = 0; k < (unsigned)o.atomics; k++) {
			uint64_t v = aw_value(idx, k);
			ibv_wr_start(q);
			q->wr_id = k;
			q->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_atomic_write(q, peer.rkey, peer.addr + GUARD + 8 * k, &v);
			int rc = ibv_wr_complete(q);
			if (rc)
				die("ATOMIC WRITE: ibv_wr_complete: %s", strerror(rc));
			struct ibv_wc wc = poll1(scq, "ATOMIC WRITE");
			if (wc.status != IBV_WC_SUCCESS)
				die("message %u ATOMIC WRITE %u: %s", idx, k, wc_str(wc.status));
			if (wc.opcode != IBV_WC_ATOMIC_WRITE || wc.wr_id != k)
				fail("message %u ATOMIC WRITE %u: wc opcode %d (want %d) wr_id %llu", idx,
				     k, wc.opcode, IBV_WC_ATOMIC_WRITE, (unsigned long long)wc.wr_id);
		}
		size = 8 * o.atomics;
	} else if (o.op == OP_CAS || o.op == OP_FAA) {
		for (unsigned k = 0; k < (unsigned)o.atomics; k++) {
			uint64_t orig = 0x0101010101010101ull * (k + 1) ^ ((uint64_t)idx << 40);
			uint64_t *res = (uint64_t *)(buf + GUARD + 8 * k);
			struct ibv_sge as = { .addr = (uintptr_t)res, .length = 8, .lkey = mr->lkey };
			struct ibv_send_wr aw = { .wr_id = k, .sg_list = &as, .num_sge = 1,
						  .send_flags = IBV_SEND_SIGNALED };
			aw.wr.atomic.remote_addr = peer.addr + GUARD + 8 * k;
			aw.wr.atomic.rkey = peer.rkey;
			if (o.op == OP_FAA) {
				aw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
				aw.wr.atomic.compare_add = 0x100000001ull * (k + 1);
			} else {
				aw.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
				aw.wr.atomic.compare_add = (k & 1) ? orig + 1 : orig;
				aw.wr.atomic.swap = ~orig;
			}
			int rc = ibv_post_send(qp, &aw, &bad);
			if (rc)
				die("post atomic: %s", strerror(rc));
			struct ibv_wc wc = poll1(scq, "atomic");
			want = o.op == OP_FAA ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP;
			if (wc.status != IBV_WC_SUCCESS)
				die("message %u atomic %u: %s", idx, k, wc_str(wc.status));
			if (wc.opcode != want || wc.wr_id != k)
				fail("message %u atomic %u: wc opcode %d wr_id %llu", idx, k, wc.opcode,
				     (unsigned long long)wc.wr_id);
			if (*res != orig)
				fail("message %u atomic %u: original value 0x%016llx, want 0x%016llx", idx,
				     k, (unsigned long long)*res, (unsigned long long)orig);
			else
				verified += 8;
		}
		size = 8 * o.atomics;
	} else {
		int rc = ibv_post_send(qp, &wr, &bad);
		if (rc)
			die("post_send: %s", strerror(rc));
		struct ibv_wc wc = poll1(scq, "send");
		if (wc.status != IBV_WC_SUCCESS)
			die("message %u (%zu B): send completion %s", idx, size, wc_str(wc.status));
		if (wc.opcode != want || wc.wr_id != idx)
			fail("message %u: wc opcode %d (want %d) wr_id %llu", idx, wc.opcode, want,
			     (unsigned long long)wc.wr_id);
		if (o.op == OP_FLUSH) {
			/* the WRITE made globally visible: the range it wrote
			 * (even messages) or the whole MR (odd ones) */
			struct qp_ex45 *q = (struct qp_ex45 *)ibv_qp_to_qp_ex(qp);
			uint8_t sel = idx & 1 ? FLUSH_MR : FLUSH_RANGE;
			ibv_wr_start(&q->base);
			q->base.wr_id = 1000 + idx;
			q->base.wr_flags = IBV_SEND_SIGNALED;
			q->wr_flush(&q->base, peer.rkey, peer.addr + roff, size, FLUSH_GLOBAL, sel);
			rc = ibv_wr_complete(&q->base);
			if (rc)
				die("FLUSH: ibv_wr_complete: %s", strerror(rc));
			wc = poll1(scq, "FLUSH");
			if (wc.status != IBV_WC_SUCCESS)
				die("message %u: FLUSH (%s) completion %s", idx,
				    sel == FLUSH_MR ? "MR" : "range", wc_str(wc.status));
			if (wc.opcode != WC_FLUSH || wc.wr_id != 1000 + idx)
				fail("message %u: FLUSH wc opcode %d (want %d) wr_id %llu", idx, wc.opcode,
				     WC_FLUSH, (unsigned long long)wc.wr_id);
		}
		if (o.op == OP_READ) {
			if (wc.byte_len != size)
				fail("message %u: READ byte_len %u, want %zu", idx, wc.byte_len, size);
			check_pat("READ result", buf + loff, size, idx, salt());
			check_fill("before READ target", buf, loff, idx);
			check_fill("after READ target", buf + loff + size, GUARD, idx);
		}
	}
	say("D %u", idx);
	total_bytes += size;
}

/* ------------------------------------------------------------ error modes */

/* RNR: the responder posts its receive rnr_delay_ms after "R". */
static void rnr(void)
{
	size_t size = sizes[0];
	if (o.is_server) {
		memset(buf, FILL, buf_len);
		say("R 0");
		usleep(o.rnr_delay_ms * 1000);
		post_recv(buf + GUARD, size, 0);
		struct ibv_wc wc = poll1(rcq, "receive");
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != size)
			fail("RNR receive: %s opcode %d byte_len %u", wc_str(wc.status), wc.opcode,
			     wc.byte_len);
		check_pat("received after RNR", buf + GUARD, size, 0, salt());
		check_fill("after target", buf + GUARD + size, GUARD, 0);
		expect('D', 0);
		printf("RNR responder posted its receive %d ms late, min_rnr_timer %d\n", o.rnr_delay_ms,
		       o.min_rnr_timer);
	} else {
		memset(buf, FILL, buf_len);
		fill_pat(buf + GUARD, size, 0, salt());
		struct ibv_sge sge = { .addr = (uintptr_t)buf + GUARD, .length = size, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		expect('R', 0);
		double t0 = now_s();
		if (ibv_post_send(qp, &wr, &bad))
			die("post_send");
		struct ibv_wc wc = poll1(scq, "send");
		double dt = now_s() - t0;
		say("D 0");
		printf("RNR requester: %s after %.1f ms (rnr_retry %d; responder late by %d ms)\n",
		       wc_str(wc.status), dt * 1e3, o.rnr_retry, o.rnr_delay_ms);
		if (wc.status != IBV_WC_SUCCESS)
			fail("RNR send: %s, want success", wc_str(wc.status));
		if (dt * 1e3 < o.rnr_delay_ms * 0.5)
			fail("RNR send completed after %.1f ms, before the receive was posted (%d ms)",
			     dt * 1e3, o.rnr_delay_ms);
	}
	total_bytes = size;
}

/* Bad rkey: an RDMA WRITE with a wrong rkey must fail with REM_ACCESS_ERR
 * and leave the responder's memory alone. */
static void bad_rkey(void)
{
	size_t size = sizes[0];
	memset(buf, FILL, buf_len);
	if (o.is_server) {
		say("R 0");
		expect('D', 0);
		check_fill("memory behind the bad rkey", buf, buf_len, 0);
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
		printf("ACCESS responder QP state after the bad WRITE: %d (%s)\n", a.qp_state,
		       a.qp_state == IBV_QPS_ERR ? "ERR" : a.qp_state == IBV_QPS_RTS ? "RTS" : "other");
	} else {
		fill_pat(buf + GUARD, size, 0, salt());
		struct ibv_sge sge = { .addr = (uintptr_t)buf + GUARD, .length = size, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge, .num_sge = 1,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.rdma.remote_addr = peer.addr + GUARD;
		wr.wr.rdma.rkey = peer.rkey ^ 0x5a00; /* another index, same key byte */
		expect('R', 0);
		if (ibv_post_send(qp, &wr, &bad))
			die("post_send");
		struct ibv_wc wc = poll1(scq, "send");
		printf("ACCESS requester: WRITE with rkey 0x%08x: %s (vendor_err 0x%x)\n",
		       wr.wr.rdma.rkey, wc_str(wc.status), wc.vendor_err);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			fail("bad rkey WRITE completed with %s, want %s", wc_str(wc.status),
			     wc_str(IBV_WC_REM_ACCESS_ERR));
		say("D 0");
	}
	total_bytes = size;
}

/* Vanished peer: the responder leaves; the requester's SEND must end in
 * RETRY_EXC_ERR after (retry_cnt + 1) timeouts of 4.096 us * 2^timeout. */
static void vanish(void)
{
	if (o.is_server) {
		say("BYE");
		ibv_destroy_qp(qp);
		printf("VANISH responder destroyed its QP and leaves\n");
		printf("PEER-OK op=vanish role=responder msgs=0 bytes=0 verified=0\n");
		exit(0);
	}
	char b[64];
	hear(b, sizeof b);
	if (strncmp(b, "BYE", 3))
		die("want BYE, got %s", b);
	/* the responder's QP is gone once its TCP side closes */
	if (fgets(b, sizeof b, sin_))
		die("unexpected line after BYE: %s", b);
	memset(buf, FILL, buf_len);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	double t0 = now_s();
	if (ibv_post_send(qp, &wr, &bad))
		die("post_send");
	struct ibv_wc wc = poll1(scq, "send");
	double dt = (now_s() - t0) * 1e3;
	double want = 4.096e-3 * (1 << o.timeout) * (o.retry_cnt + 1);
	printf("VANISH requester: %s after %.1f ms; expected %.1f ms = 4.096 us * 2^%d * (%d + 1)\n",
	       wc_str(wc.status), dt, want, o.timeout, o.retry_cnt);
	if (wc.status != IBV_WC_RETRY_EXC_ERR)
		fail("SEND to a vanished peer completed with %s, want %s", wc_str(wc.status),
		     wc_str(IBV_WC_RETRY_EXC_ERR));
	/* Tolerance: at least 3/4 of the nominal time (timers may fire a
	 * jiffy early and the first timeout can start before the post
	 * returns); at most twice it plus 250 ms (a busy TCG guest or host). */
	if (dt < 0.75 * want || dt > 2 * want + 250)
		fail("RETRY_EXC_ERR after %.1f ms, outside [%.1f, %.1f] ms", dt, 0.75 * want,
		     2 * want + 250);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: rxe-interop-peer -o OP [-d DEV] [-g GIDX] [-p PORT] [-m MTU] [-S SIZES]\n"
		"       [--rnr-delay MS] [--min-rnr-timer N] [--rnr-retry N] [--timeout N] [--retry-cnt N]\n"
		"       [--linger MS]\n"
		"       [HOST]   (no HOST: server and responder; HOST: client and requester)\n"
		"OP: send send-imm write write-imm read cas faa srq-send uc-send uc-write ud-send\n"
		"    rnr bad-rkey vanish flush (rdma-core >= 45) atomic-write\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "rnr-delay", 1, 0, 1 }, { "min-rnr-timer", 1, 0, 2 }, { "rnr-retry", 1, 0, 3 },
		{ "timeout", 1, 0, 4 }, { "retry-cnt", 1, 0, 5 }, { "linger", 1, 0, 6 }, { 0 } };
	int c, opset = 0;
	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((c = getopt_long(argc, argv, "o:d:g:p:m:S:", lo, NULL)) != -1) {
		switch (c) {
		case 'o':
			for (int i = 0; op_names[i]; i++)
				if (!strcmp(optarg, op_names[i]))
					o.op = i, opset = 1;
			if (!opset)
				usage();
			break;
		case 'd': o.dev = optarg; break;
		case 'g': o.gid_idx = atoi(optarg); break;
		case 'p': o.port = atoi(optarg); break;
		case 'm': o.mtu = atoi(optarg); break;
		case 'S': o.sizes = optarg; break;
		case 1: o.rnr_delay_ms = atoi(optarg); break;
		case 2: o.min_rnr_timer = atoi(optarg); break;
		case 3: o.rnr_retry = atoi(optarg); break;
		case 4: o.timeout = atoi(optarg); break;
		case 5: o.retry_cnt = atoi(optarg); break;
		case 6: o.linger_ms = atoi(optarg); break;
		default: usage();
		}
	}
	if (!opset || argc - optind > 1)
		usage();
	o.is_server = optind == argc;
	o.host = o.is_server ? NULL : argv[optind];
	role = o.is_server ? "responder" : "requester";
	parse_sizes();
	size_t max = 0;
	for (unsigned i = 0; i < nsizes; i++)
		if (sizes[i] > max)
			max = sizes[i];
	if (max < 8 * 64)
		max = 8 * 64;
	setup(max);
	tcp_connect();
	exchange();
	connect_qp();
	/* both QPs are ready before any request leaves */
	say("READY");
	char b[64];
	hear(b, sizeof b);
	if (strncmp(b, "READY", 5))
		die("want READY, got %s", b);
	double t0 = now_s();
	unsigned msgs = nsizes;
	switch (o.op) {
	case OP_RNR: rnr(); msgs = 1; break;
	case OP_BAD_RKEY: bad_rkey(); msgs = 1; break;
	case OP_VANISH: vanish(); msgs = 1; break;
	default:
		for (unsigned i = 0; i < nsizes; i++) {
			if (o.is_server)
				responder_msg(i, sizes[i]);
			else
				requester_msg(i, sizes[i]);
		}
	}
	double dt = now_s() - t0;
	if (failures) {
		printf("FAILED op=%s role=%s: %d failures\n", op_names[o.op], role, failures);
		return 1;
	}
	printf("PEER-OK op=%s role=%s msgs=%u bytes=%lld verified=%lld secs=%.3f\n", op_names[o.op], role,
	       msgs, total_bytes, verified, dt);
	/* --linger: keep the device open, so its counters can still be read
	 * (rxe-emu's engine, and so its counters, live in this process) */
	usleep(o.linger_ms * 1000);
	return 0;
}
