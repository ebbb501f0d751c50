/* RDMA FLUSH through ibv_wr_flush between two RC QPs of one device, as
 * kernel rxe (Linux 6.2+) with rdma-core 45+ serves it: the device reports
 * IBV_DEVICE_FLUSH_GLOBAL and _PERSISTENT in device_cap_flags_ex, a QP
 * takes IBV_QP_EX_WITH_FLUSH, IBV_ACCESS_FLUSH_PERSISTENT is refused at
 * registration (EINVAL: not pmem) and _GLOBAL accepted, a FLUSH of a range
 * and of a whole MR complete as IBV_WC_FLUSH, and a FLUSH of an MR
 * registered without IBV_ACCESS_FLUSH_GLOBAL completes with
 * IBV_WC_REM_ACCESS_ERR. Prints "FAIL ..." and exits 1 on the first
 * surprise, "ALL OK" at the end.
 *
 * The system headers may be rdma-core 44's, which predate FLUSH: the
 * values of rdma-core 45's verbs.h are spelled out here, and wr_flush is
 * the ibv_qp_ex member that rdma-core 45 appended after wr_atomic_write. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define WC_FLUSH 8			/* IBV_WC_FLUSH */
#define QP_EX_WITH_FLUSH (1ULL << 11)	/* IBV_QP_EX_WITH_FLUSH */
#define ACCESS_FLUSH_GLOBAL (1 << 8)	/* IBV_ACCESS_FLUSH_GLOBAL */
#define ACCESS_FLUSH_PERSISTENT (1 << 9) /* IBV_ACCESS_FLUSH_PERSISTENT */
#define FLUSH_GLOBAL 1			/* IBV_FLUSH_GLOBAL */
#define FLUSH_RANGE 0			/* IBV_FLUSH_RANGE */
#define FLUSH_MR 1			/* IBV_FLUSH_MR */
#define DEVICE_FLUSH_GLOBAL (1ULL << 38)	/* IBV_DEVICE_FLUSH_GLOBAL */
#define DEVICE_FLUSH_PERSISTENT (1ULL << 39) /* IBV_DEVICE_FLUSH_PERSISTENT */

typedef void (*wr_flush_fn)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			    size_t len, uint8_t type, uint8_t level);

/* ibv_wr_flush of rdma-core 45's verbs.h. */
static void wr_flush(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, size_t len,
		     uint8_t type, uint8_t level)
{
	wr_flush_fn f;
	memcpy(&f, (char *)q + offsetof(struct ibv_qp_ex, wr_atomic_write) + sizeof(f),
	       sizeof(f));
	CHECK(f, "ibv_qp_ex has no wr_flush");
	f(q, rkey, addr, len, type, level);
}

static void connect_flush(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	connect_qp_access(qp, dest, gid,
			  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | ACCESS_FLUSH_GLOBAL);
}

static char src[256], dst[4096], plain[256];

/* One signaled FLUSH through the ibv_wr_* API; its completion. */
static struct ibv_wc flush1(struct ibv_qp_ex *x, struct ibv_cq *cq, uint64_t wr_id,
			    uint32_t rkey, uint64_t addr, size_t len, uint8_t level)
{
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	wr_flush(x, rkey, addr, len, FLUSH_GLOBAL, level);
	EXPECT_RC(ibv_wr_complete(x), 0);
	return poll1(cq);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");

	struct ibv_device_attr_ex dx;
	EXPECT_RC(ibv_query_device_ex(ctx, NULL, &dx), 0);
	CHECK((dx.device_cap_flags_ex & DEVICE_FLUSH_GLOBAL) &&
		      (dx.device_cap_flags_ex & DEVICE_FLUSH_PERSISTENT),
	      "device_cap_flags_ex %#llx lacks FLUSH", (unsigned long long)dx.device_cap_flags_ex);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq");

	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	/* Kernel rxe registers PERSISTENT only over pmem pages. */
	EXPECT_NULL_ERRNO(ibv_reg_mr(pd, dst, sizeof(dst), rw | ACCESS_FLUSH_PERSISTENT), EINVAL);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), rw | ACCESS_FLUSH_GLOBAL);
	CHECK(dmr, "reg_mr FLUSH_GLOBAL");
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *pmr = ibv_reg_mr(pd, plain, sizeof(plain), rw);
	CHECK(smr && pmr, "reg_mr");

	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 16;
	qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | QP_EX_WITH_FLUSH;
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa);
	CHECK(a, "create_qp_ex with IBV_QP_EX_WITH_FLUSH");
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &qa);
	CHECK(b, "create_qp_ex b");
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	CHECK(ax, "qp_to_qp_ex");
	union ibv_gid gid;
	EXPECT_RC(ibv_query_gid(ctx, 1, 1, &gid), 0);
	connect_flush(a, b->qp_num, &gid);
	connect_flush(b, a->qp_num, &gid);

	/* Write, then flush that range. */
	memset(src, 0x5a, sizeof(src));
	struct ibv_wc wc = rdma(a, cq, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src, 256,
				dmr->rkey, (uintptr_t)dst + 512);
	CHECK(wc.status == IBV_WC_SUCCESS, "write: %s", ibv_wc_status_str(wc.status));
	wc = flush1(ax, cq, 11, dmr->rkey, (uintptr_t)dst + 512, 256, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == WC_FLUSH && wc.wr_id == 11 &&
		      wc.byte_len == 256,
	      "range flush: status %s opcode %d wr_id %llu byte_len %u",
	      ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)wc.wr_id,
	      wc.byte_len);
	for (int i = 0; i < (int)sizeof(dst); i++)
		CHECK(dst[i] == ((i >= 512 && i < 768) ? 0x5a : 0), "dst[%d] = %#x", i, dst[i]);

	/* The whole MR: the address and length are not looked at. */
	wc = flush1(ax, cq, 12, dmr->rkey, 0, 0, FLUSH_MR);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == WC_FLUSH && wc.wr_id == 12,
	      "MR flush: status %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);

	/* An MR without IBV_ACCESS_FLUSH_GLOBAL: remote access error (kernel
	 * check_rkey); the QP then goes to the error state, so this is last. */
	wc = flush1(ax, cq, 13, pmr->rkey, (uintptr_t)plain, 64, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 13,
	      "flush of an MR without FLUSH_GLOBAL: %s", ibv_wc_status_str(wc.status));
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr iattr;
	EXPECT_RC(ibv_query_qp(a, &qattr, IBV_QP_STATE, &iattr), 0);
	CHECK(qattr.qp_state == IBV_QPS_ERR, "requester state %d", qattr.qp_state);

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(pmr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ALL OK\n");
	return 0;
}
