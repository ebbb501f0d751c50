/* Inline data and SGE lists through the ibv_wr_* API on a QP created with
 * max_send_sge = 1, as the rxe provider handles them: a list of buffers is
 * inline data (bounded by max_inline_data, not by max_send_sge), too much
 * of it or too many SGEs fail ibv_wr_complete with ENOSPC, and
 * ibv_post_send keeps its own rules (EINVAL); a UD batch with a send
 * that has no address fails whole with EINVAL. Prints "FAIL ..." and exits 1
 * on the first surprise, "ALL OK" at the end. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char src[256], dst[256], rbuf[256];

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq");

	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 16;
	qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 64;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa);
	CHECK(a, "create_qp_ex a");
	unsigned max_inline = qa.cap.max_inline_data;
	CHECK(max_inline >= 64 && max_inline < 200, "max_inline_data %u", max_inline);
	CHECK(qa.cap.max_send_sge >= 1, "max_send_sge %u", qa.cap.max_send_sge);
	unsigned max_sge = qa.cap.max_send_sge;
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &qa);
	CHECK(b, "create_qp_ex b");
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	CHECK(ax, "qp_to_qp_ex");

	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), acc);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), acc);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), acc);
	CHECK(smr && dmr && rmr, "reg_mr");
	union ibv_gid gid;
	EXPECT_RC(ibv_query_gid(ctx, 1, 1, &gid), 0);
	connect_qp(a, b->qp_num, &gid);
	connect_qp(b, a->qp_num, &gid);

	char p1[10], p2[20], p3[30];
	memset(p1, 'a', sizeof(p1));
	memset(p2, 'b', sizeof(p2));
	memset(p3, 'c', sizeof(p3));
	struct ibv_data_buf bufs[3] = {{p1, sizeof(p1)}, {p2, sizeof(p2)}, {p3, sizeof(p3)}};
	char want[60];
	memcpy(want, p1, 10);
	memcpy(want + 10, p2, 20);
	memcpy(want + 30, p3, 30);

	/* An RDMA WRITE of three inline buffers on a QP with one SGE. */
	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst + 5);
	ibv_wr_set_inline_data_list(ax, 3, bufs);
	/* The program may reuse its buffers at once. */
	memset(p1, 'x', sizeof(p1));
	EXPECT_RC(ibv_wr_complete(ax), 0);
	struct ibv_wc wc = poll1(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "inline write: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(memcmp(dst + 5, want, 60) == 0, "inline write data");
	CHECK(dst[4] == 0 && dst[65] == 0, "inline write stayed in place");

	/* A SEND of three inline buffers into a posted receive. */
	struct ibv_sge rs = {.addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 9, .sg_list = &rs, .num_sge = 1}, *rbad;
	EXPECT_RC(ibv_post_recv(b, &rw, &rbad), 0);
	memset(p1, 'a', sizeof(p1));
	ibv_wr_start(ax);
	ax->wr_id = 2;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_inline_data_list(ax, 3, bufs);
	EXPECT_RC(ibv_wr_complete(ax), 0);
	int got_send = 0, got_recv = 0;
	while (!got_send || !got_recv) {
		wc = poll1(cq);
		CHECK(wc.status == IBV_WC_SUCCESS, "inline send: %s", ibv_wc_status_str(wc.status));
		if (wc.wr_id == 2)
			got_send = 1;
		else if (wc.wr_id == 9) {
			got_recv = 1;
			CHECK(wc.byte_len == 60, "received %u bytes", wc.byte_len);
		}
	}
	CHECK(memcmp(rbuf, want, 60) == 0, "inline send data");

	/* Exactly max_inline_data bytes in a list of three: accepted. */
	static char big[256];
	memset(big, 'z', sizeof(big));
	struct ibv_data_buf fit[3] = {{big, 1}, {big, max_inline - 2}, {big, 1}};
	ibv_wr_start(ax);
	ax->wr_id = 3;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_inline_data_list(ax, 3, fit);
	EXPECT_RC(ibv_wr_complete(ax), 0);
	wc = poll1(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 3, "max inline write");

	/* One byte more: ENOSPC, in a list and as one buffer. */
	struct ibv_data_buf over[3] = {{big, 1}, {big, max_inline - 1}, {big, 1}};
	ibv_wr_start(ax);
	ax->wr_id = 4;
	ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_inline_data_list(ax, 3, over);
	EXPECT_RC(ibv_wr_complete(ax), ENOSPC);
	ibv_wr_start(ax);
	ax->wr_id = 5;
	ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_inline_data(ax, big, max_inline + 1);
	EXPECT_RC(ibv_wr_complete(ax), ENOSPC);

	/* More SGEs than max_send_sge: ENOSPC, as the rxe provider. */
	struct ibv_sge two[2] = {{(uintptr_t)src, 8, smr->lkey}, {(uintptr_t)src + 8, 8, smr->lkey}};
	if (max_sge < 2) {
		ibv_wr_start(ax);
		ax->wr_id = 6;
		ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst);
		ibv_wr_set_sge_list(ax, 2, two);
		EXPECT_RC(ibv_wr_complete(ax), ENOSPC);
	}

	/* ibv_post_send keeps the rxe provider's rules: num_sge is bounded
	 * by max_send_sge even with IBV_SEND_INLINE, and the inline length by
	 * max_inline_data; both EINVAL. */
	struct ibv_send_wr w = {0}, *bad;
	w.wr_id = 7;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	w.wr.rdma.rkey = dmr->rkey;
	w.wr.rdma.remote_addr = (uintptr_t)dst;
	if (max_sge < 2) {
		w.sg_list = two;
		w.num_sge = 2;
		EXPECT_RC(ibv_post_send(a, &w, &bad), EINVAL);
	}
	struct ibv_sge one = {(uintptr_t)big, max_inline + 1, 0};
	w.sg_list = &one;
	w.num_sge = 1;
	EXPECT_RC(ibv_post_send(a, &w, &bad), EINVAL);
	one.length = max_inline;
	EXPECT_RC(ibv_post_send(a, &w, &bad), 0);
	wc = poll1(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "post_send inline write");

	/* A UD batch in which one send lacks ibv_wr_set_ud_addr: EINVAL at
	 * ibv_wr_complete, and none of the batch is posted (the one with an
	 * address before it neither), as a batch fails whole. */
	struct ibv_qp_init_attr_ex ua = qa;
	ua.qp_type = IBV_QPT_UD;
	ua.cap.max_inline_data = 0;
	ua.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *u = ibv_create_qp_ex(ctx, &ua);
	CHECK(u, "create_qp_ex ud");
	struct ibv_qp_attr ux = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11};
	EXPECT_RC(ibv_modify_qp(u, &ux, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					IBV_QP_QKEY),
		  0);
	ux.qp_state = IBV_QPS_RTR;
	EXPECT_RC(ibv_modify_qp(u, &ux, IBV_QP_STATE), 0);
	ux.qp_state = IBV_QPS_RTS;
	ux.sq_psn = 1;
	EXPECT_RC(ibv_modify_qp(u, &ux, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1,
				 .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 1}};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create_ah");
	struct ibv_qp_ex *ux_ = ibv_qp_to_qp_ex(u);
	CHECK(ux_, "qp_to_qp_ex ud");
	ibv_wr_start(ux_);
	ux_->wr_id = 20;
	ux_->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ux_);
	ibv_wr_set_sge(ux_, smr->lkey, (uintptr_t)src, 8);
	ibv_wr_set_ud_addr(ux_, ah, u->qp_num, 0x11);
	ux_->wr_id = 21;
	ibv_wr_send(ux_);
	ibv_wr_set_sge(ux_, smr->lkey, (uintptr_t)src, 8);
	EXPECT_RC(ibv_wr_complete(ux_), EINVAL);

	/* Nothing refused above reached the wire: no other completion. */
	for (int i = 0; i < 1000; i++)
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "stray completion wr_id %llu",
		      (unsigned long long)wc.wr_id);

	ibv_destroy_qp(u);
	ibv_destroy_ah(ah);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ALL OK\n");
	return 0;
}
