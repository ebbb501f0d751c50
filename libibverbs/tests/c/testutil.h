/* Helpers shared by the C test programs: checks that print "FAIL line N"
 * and exit 1, polling one completion, connecting an RC QP to a QP of the
 * same device, and posting one signaled RDMA work request. */
#ifndef RXE_EMU_TEST_UTIL_H
#define RXE_EMU_TEST_UTIL_H
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static inline struct ibv_wc rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
			  uint32_t lkey, uint64_t laddr, uint32_t len, uint32_t rkey,
			  uint64_t raddr)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = 7;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = raddr;
	EXPECT_RC(ibv_post_send(qp, &wr, &bad), 0);
	return poll1(cq);
}

#endif
