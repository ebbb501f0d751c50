/* Device memory and parent domains on rxe-emu: every error path a program
 * can meet, and DM as the source and target of RDMA through a QP created
 * in a parent domain. Prints "FAIL ..." and exits 1 on the first surprise,
 * "ALL OK" at the end. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_device_attr_ex dx;
	EXPECT_RC(ibv_query_device_ex(ctx, NULL, &dx), 0);
	CHECK(dx.max_dm_size >= 65536, "max_dm_size %llu", (unsigned long long)dx.max_dm_size);

	/* --- device memory: allocation and copies --- */
	struct ibv_alloc_dm_attr da = {.length = dx.max_dm_size + 1};
	EXPECT_NULL_ERRNO(ibv_alloc_dm(ctx, &da), EINVAL);
	da.length = 0;
	EXPECT_NULL_ERRNO(ibv_alloc_dm(ctx, &da), EINVAL);
	da.length = 4096;
	da.comp_mask = 1;
	EXPECT_NULL_ERRNO(ibv_alloc_dm(ctx, &da), EINVAL);
	da.comp_mask = 0;
	da.log_align_req = 13;
	EXPECT_NULL_ERRNO(ibv_alloc_dm(ctx, &da), EINVAL);
	da.log_align_req = 6;
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
	CHECK(dm, "alloc_dm 4096");
	char buf[4096], back[4096];
	for (int i = 0; i < 4096; i++)
		buf[i] = (char)(i * 7 + 1);
	EXPECT_RC(ibv_memcpy_to_dm(dm, 0, buf, 4096), 0);
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 0, 4096), 0);
	CHECK(memcmp(buf, back, 4096) == 0, "DM round trip");
	EXPECT_RC(ibv_memcpy_to_dm(dm, 2, buf, 8), EINVAL);
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 0, 6), EINVAL);
	EXPECT_RC(ibv_memcpy_to_dm(dm, 4092, buf, 8), EFAULT);
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 4096, 4), EFAULT);
	EXPECT_RC(ibv_memcpy_to_dm(dm, UINT64_MAX - 3, buf, 8), EFAULT);

	/* --- thread and parent domains --- */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	struct ibv_td_init_attr ta = {.comp_mask = 1};
	EXPECT_NULL_ERRNO(ibv_alloc_td(ctx, &ta), EINVAL);
	ta.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &ta);
	CHECK(td, "alloc_td");
	struct ibv_parent_domain_init_attr pa = {.pd = NULL, .td = td};
	EXPECT_NULL_ERRNO(ibv_alloc_parent_domain(ctx, &pa), EINVAL);
	pa.pd = pd;
	/* rdma-core 65's ALLOW_CC_UNPROTECTED_ALLOC (1 << 2): not supported;
	 * a bit nobody defines: invalid */
	pa.comp_mask = 4;
	EXPECT_NULL_ERRNO(ibv_alloc_parent_domain(ctx, &pa), EOPNOTSUPP);
	pa.comp_mask = 8;
	EXPECT_NULL_ERRNO(ibv_alloc_parent_domain(ctx, &pa), EINVAL);
	pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	pa.pd_context = buf;
	struct ibv_pd *par = ibv_alloc_parent_domain(ctx, &pa);
	CHECK(par, "alloc_parent_domain");
	CHECK(par->context == ctx, "parent domain context");
	struct ibv_parent_domain_init_attr pa2 = {.pd = par};
	EXPECT_NULL_ERRNO(ibv_alloc_parent_domain(ctx, &pa2), EINVAL);
	EXPECT_RC(ibv_dealloc_pd(pd), EBUSY);
	EXPECT_RC(ibv_dealloc_td(td), EBUSY);

	struct ibv_cq_init_attr_ex ca = {.cqe = 16,
					 .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					 .parent_domain = pd};
	EXPECT_NULL_ERRNO(ibv_create_cq_ex(ctx, &ca), EINVAL);
	ca.parent_domain = par;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqx, "create_cq_ex with a parent domain");
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);

	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 8;
	qa.cap.max_recv_wr = 8;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = par;
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa);
	CHECK(a, "create_qp_ex in a parent domain");
	CHECK(a->pd == par, "qp->pd");
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &qa);
	CHECK(b, "second QP");
	EXPECT_RC(ibv_dealloc_pd(par), EBUSY);

	/* --- DM MRs --- */
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	EXPECT_NULL_ERRNO(ibv_reg_dm_mr(par, dm, 0, 1024, acc), EINVAL);
	acc |= IBV_ACCESS_ZERO_BASED;
	EXPECT_NULL_ERRNO(ibv_reg_dm_mr(par, dm, 1024, 4096, acc), EINVAL);
	EXPECT_NULL_ERRNO(ibv_reg_dm_mr(par, dm, 4100, 0, acc), EINVAL);
	/* The DM bytes 1024..3072, addressed 0..2048. */
	struct ibv_mr *dmr = ibv_reg_dm_mr(par, dm, 1024, 2048, acc);
	CHECK(dmr, "reg_dm_mr");
	CHECK(dmr->length == 2048 && dmr->pd == par, "dm mr fields");
	EXPECT_RC(ibv_free_dm(dm), EBUSY);
	EXPECT_NULL_ERRNO(ibv_rereg_mr(dmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				       IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT
				  ? NULL
				  : (void *)1,
			  EINVAL);
	static char host[8192];
	struct ibv_mr *hmr = ibv_reg_mr(par, host, sizeof(host), acc & ~IBV_ACCESS_ZERO_BASED);
	CHECK(hmr, "reg_mr through the parent domain");

	union ibv_gid gid;
	EXPECT_RC(ibv_query_gid(ctx, 1, 1, &gid), 0);
	connect_qp(a, b->qp_num, &gid);
	connect_qp(b, a->qp_num, &gid);

	/* DM as a local source: DM offset 1024+16.. to host[0..64). */
	struct ibv_wc wc = rdma(a, cq, IBV_WR_RDMA_WRITE, dmr->lkey, 16, 64, hmr->rkey,
				(uintptr_t)host);
	CHECK(wc.status == IBV_WC_SUCCESS, "write from DM: %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(host, buf + 1024 + 16, 64) == 0, "data written from DM");
	/* DM as a remote target: host[100..200) to DM va 2000.. (offset 3024). */
	memset(host + 100, 0x5a, 48);
	wc = rdma(a, cq, IBV_WR_RDMA_WRITE, hmr->lkey, (uintptr_t)host + 100, 48, dmr->rkey,
		  2000);
	CHECK(wc.status == IBV_WC_SUCCESS, "write to DM: %s", ibv_wc_status_str(wc.status));
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 3024, 48), 0);
	CHECK(memcmp(back, host + 100, 48) == 0, "data written to DM");
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 3072, 4), 0);
	CHECK(memcmp(back, buf + 3072, 4) == 0, "DM past the MR untouched");
	/* RDMA READ of DM: va 0..32. */
	wc = rdma(a, cq, IBV_WR_RDMA_READ, hmr->lkey, (uintptr_t)host + 4096, 32, dmr->rkey, 0);
	CHECK(wc.status == IBV_WC_SUCCESS, "read DM: %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(host + 4096, buf + 1024, 32) == 0, "data read from DM");
	/* Past the end of the DM MR, remotely: an access error, nothing written. */
	wc = rdma(a, cq, IBV_WR_RDMA_WRITE, hmr->lkey, (uintptr_t)host, 16, dmr->rkey, 2040);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "write past the DM MR: %s",
	      ibv_wc_status_str(wc.status));
	EXPECT_RC(ibv_memcpy_from_dm(back, dm, 3064, 16), 0);
	CHECK(memcmp(back, host + 100, 8) == 0 && memcmp(back + 8, buf + 3072, 8) == 0,
	      "nothing written by the refused WRITE");
	/* Past the end locally, on a fresh pair: a local protection error. */
	struct ibv_qp *c2 = ibv_create_qp_ex(ctx, &qa), *d2 = ibv_create_qp_ex(ctx, &qa);
	CHECK(c2 && d2, "QPs");
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	connect_qp(c2, d2->qp_num, &gid);
	connect_qp(d2, c2->qp_num, &gid);
	wc = rdma(c2, cq, IBV_WR_RDMA_WRITE, dmr->lkey, 2040, 16, hmr->rkey, (uintptr_t)host);
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR, "local SGE past the DM MR: %s",
	      ibv_wc_status_str(wc.status));

	/* --- teardown in dependency order --- */
	EXPECT_RC(ibv_destroy_qp(a), 0);
	EXPECT_RC(ibv_destroy_qp(b), 0);
	EXPECT_RC(ibv_destroy_qp(c2), 0);
	EXPECT_RC(ibv_destroy_qp(d2), 0);
	EXPECT_RC(ibv_dereg_mr(hmr), 0);
	EXPECT_RC(ibv_dealloc_pd(par), EBUSY); /* the DM MR and the CQ */
	EXPECT_RC(ibv_dereg_mr(dmr), 0);
	EXPECT_RC(ibv_dealloc_pd(par), EBUSY); /* the CQ */
	EXPECT_RC(ibv_destroy_cq(cq), 0);
	EXPECT_RC(ibv_dealloc_pd(par), 0);
	EXPECT_RC(ibv_dealloc_td(td), 0);
	EXPECT_RC(ibv_dealloc_pd(pd), 0);
	EXPECT_RC(ibv_free_dm(dm), 0);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ALL OK\n");
	return 0;
}
