/* On-demand paging on rxe-emu: ODP MRs whose pages come and go, implicit
 * ODP, and ibv_advise_mr. An RDMA access to a page that is not mapped
 * fails with an error completion, as on a NIC that cannot resolve the
 * fault; the process never crashes. Prints "ALL OK" at the end. */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

struct pair {
	struct ibv_cq *cqa, *cqb;
	struct ibv_qp *a, *b;
};

static struct pair mkpair(struct ibv_context *ctx, struct ibv_pd *pd, union ibv_gid *gid)
{
	struct pair p;
	p.cqa = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	p.cqb = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.cqa && p.cqb, "create_cq");
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	ia.send_cq = ia.recv_cq = p.cqa;
	p.a = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = p.cqb;
	p.b = ibv_create_qp(pd, &ia);
	CHECK(p.a && p.b, "create_qp");
	connect_qp(p.a, p.b->qp_num, gid);
	connect_qp(p.b, p.a->qp_num, gid);
	return p;
}

int main(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_device_attr_ex dx;
	EXPECT_RC(ibv_query_device_ex(ctx, NULL, &dx), 0);
	CHECK(dx.odp_caps.general_caps & IBV_ODP_SUPPORT, "ODP general caps");
	CHECK(dx.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT, "implicit ODP caps");
	CHECK((dx.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE) &&
		      (dx.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_READ),
	      "RC ODP caps");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	union ibv_gid gid;
	EXPECT_RC(ibv_query_gid(ctx, 1, 1, &gid), 0);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

	/* Three pages under one ODP MR; the middle one goes away. */
	char *odp = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(odp != MAP_FAILED, "mmap");
	struct ibv_mr *omr = ibv_reg_mr(pd, odp, 3 * pg, acc | IBV_ACCESS_ON_DEMAND);
	CHECK(omr, "reg_mr ON_DEMAND");
	static char src[256], dst[256];
	for (int i = 0; i < 256; i++)
		src[i] = (char)(i * 7 + 3);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), acc);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), acc);
	CHECK(smr && dmr, "reg_mr");

	/* ibv_advise_mr: only ODP MRs, known advice, mapped pages. */
	struct ibv_sge sg = {.addr = (uintptr_t)odp, .length = 3 * pg, .lkey = omr->lkey};
	EXPECT_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
				&sg, 1), 0);
	struct ibv_sge bad = {.addr = (uintptr_t)src, .length = 16, .lkey = smr->lkey};
	EXPECT_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &bad, 1), EINVAL);
	struct ibv_sge past = {.addr = (uintptr_t)odp + pg, .length = 3 * pg, .lkey = omr->lkey};
	EXPECT_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1), EINVAL);
	EXPECT_RC(ibv_advise_mr(pd, 77, 0, &sg, 1), EOPNOTSUPP);

	CHECK(munmap(odp + pg, pg) == 0, "munmap the middle page");
	EXPECT_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sg, 1), EIO);
	EXPECT_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sg, 1), 0);

	/* Writes into mapped pages land; a write into the hole fails. */
	struct pair p = mkpair(ctx, pd, &gid);
	struct ibv_wc wc = rdma(p.a, p.cqa, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src, 256,
				omr->rkey, (uintptr_t)odp + 2 * pg + 8);
	CHECK(wc.status == IBV_WC_SUCCESS, "write to page 2: %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(odp + 2 * pg + 8, src, 256) == 0, "page 2 data");
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_READ, dmr->lkey, (uintptr_t)dst, 256, omr->rkey,
		  (uintptr_t)odp + 2 * pg + 8);
	CHECK(wc.status == IBV_WC_SUCCESS && memcmp(dst, src, 256) == 0, "read back page 2");
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src, 256, omr->rkey,
		  (uintptr_t)odp + pg + 8);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "write into the unmapped page: %s",
	      ibv_wc_status_str(wc.status));

	/* A READ of the hole, on a fresh pair. 256 bytes: a payload the
	 * engine would leave to the device to copy (defer_gather), were the
	 * memory not on-demand paging. */
	p = mkpair(ctx, pd, &gid);
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_READ, dmr->lkey, (uintptr_t)dst, 256, omr->rkey,
		  (uintptr_t)odp + pg);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "read of the unmapped page: %s",
	      ibv_wc_status_str(wc.status));

	/* A local SGE in the hole: the requester cannot gather it (256
	 * bytes, as above: never left to a copy that would fault). */
	p = mkpair(ctx, pd, &gid);
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_WRITE, omr->lkey, (uintptr_t)odp + pg, 256, dmr->rkey,
		  (uintptr_t)dst);
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR, "send from the unmapped page: %s",
	      ibv_wc_status_str(wc.status));

	/* Implicit ODP: the whole address space, no buffer given. */
	errno = 0;
	CHECK(ibv_reg_mr(pd, NULL, 4096, acc) == NULL && errno == EINVAL, "NULL without ODP");
	struct ibv_mr *imr = ibv_reg_mr(pd, NULL, SIZE_MAX, acc | IBV_ACCESS_ON_DEMAND);
	CHECK(imr, "implicit ODP MR");
	static char far[128];
	p = mkpair(ctx, pd, &gid);
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_WRITE, imr->lkey, (uintptr_t)src, 128, imr->rkey,
		  (uintptr_t)far);
	CHECK(wc.status == IBV_WC_SUCCESS && memcmp(far, src, 128) == 0,
	      "write through the implicit MR: %s", ibv_wc_status_str(wc.status));
	wc = rdma(p.a, p.cqa, IBV_WR_RDMA_WRITE, imr->lkey, (uintptr_t)src, 16, imr->rkey,
		  (uintptr_t)odp + pg);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "implicit MR, unmapped page: %s",
	      ibv_wc_status_str(wc.status));

	EXPECT_RC(ibv_dereg_mr(imr), 0);
	EXPECT_RC(ibv_dereg_mr(omr), 0);
	printf("ALL OK\n");
	return 0;
}
