/* XRC on rxe-emu: XRC domains named by a file (O_CREAT, O_EXCL, sharing by
 * inode, EBUSY on the last close while in use), XRC SRQs and XRC_RECV QPs,
 * and a SEND from an XRC_SEND QP landing byte for byte in the SRQ its WR
 * names. Prints "ALL OK" at the end. */
#include <fcntl.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "testutil.h"

static void modify(struct ibv_qp *qp, int state, int mask, uint32_t dest, union ibv_gid *gid)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = state;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 100;
	a.sq_psn = 100;
	a.max_dest_rd_atomic = 1;
	a.max_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	EXPECT_RC(ibv_modify_qp(qp, &a, IBV_QP_STATE | mask), 0);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd, cq");
	char path[] = "/tmp/rxe-emu-xrc-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");

	/* --- domains --- */
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = fd};
	EXPECT_NULL_ERRNO(ibv_open_xrcd(ctx, &xa), EINVAL);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS | 4;
	EXPECT_NULL_ERRNO(ibv_open_xrcd(ctx, &xa), EOPNOTSUPP);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.oflags = 0;
	EXPECT_NULL_ERRNO(ibv_open_xrcd(ctx, &xa), EINVAL); /* no domain yet, no O_CREAT */
	xa.oflags = O_CREAT;
	struct ibv_xrcd *x1 = ibv_open_xrcd(ctx, &xa);
	CHECK(x1, "open_xrcd O_CREAT");
	struct ibv_xrcd *x2 = ibv_open_xrcd(ctx, &xa);
	CHECK(x2 && x2 != x1, "second open of the same file");
	xa.oflags = O_CREAT | O_EXCL;
	EXPECT_NULL_ERRNO(ibv_open_xrcd(ctx, &xa), EINVAL);

	/* --- XRC SRQ in x1, target QP in x2: one domain --- */
	struct ibv_srq_init_attr_ex sa = {0};
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = pd;
	sa.xrcd = x1;
	EXPECT_NULL_ERRNO(ibv_create_srq_ex(ctx, &sa), EINVAL); /* no CQ */
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	sa.cq = cq;
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	CHECK(srq, "create XRC SRQ");
	uint32_t srqn = 0;
	EXPECT_RC(ibv_get_srq_num(srq, &srqn), 0);

	struct ibv_qp_init_attr_ex qa = {0};
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	EXPECT_NULL_ERRNO(ibv_create_qp_ex(ctx, &qa), EINVAL); /* no XRCD */
	qa.xrcd = x2;
	struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &qa);
	CHECK(tgt && tgt->qp_type == IBV_QPT_XRC_RECV, "create XRC_RECV");
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_XRC_RECV, .send_cq = cq, .recv_cq = cq};
	EXPECT_NULL_ERRNO(ibv_create_qp(pd, &ia), EINVAL);

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = pd;
	qa.send_cq = cq;
	qa.cap.max_send_wr = 4;
	qa.cap.max_send_sge = 1;
	struct ibv_qp *ini = ibv_create_qp_ex(ctx, &qa);
	CHECK(ini, "create XRC_SEND");

	union ibv_gid gid;
	EXPECT_RC(ibv_query_gid(ctx, 1, 1, &gid), 0);
	int init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	int rtr = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	modify(ini, IBV_QPS_INIT, init, 0, &gid);
	modify(ini, IBV_QPS_RTR, rtr, tgt->qp_num, &gid);
	modify(ini, IBV_QPS_RTS,
	       IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		       IBV_QP_MAX_QP_RD_ATOMIC,
	       0, &gid);
	modify(tgt, IBV_QPS_INIT, init, 0, &gid);
	modify(tgt, IBV_QPS_RTR, rtr | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       ini->qp_num, &gid);
	modify(tgt, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN, 0, &gid);

	static char src[3000], dst[4096];
	for (int i = 0; i < 3000; i++)
		src[i] = (char)(i * 11 + 5);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr && dmr, "reg_mr");
	struct ibv_sge rs = {(uintptr_t)dst, sizeof(dst), dmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 42, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(tgt, &rwr, &rbad) != 0, "post_recv on an XRC QP must fail");
	EXPECT_RC(ibv_post_srq_recv(srq, &rwr, &rbad), 0);
	struct ibv_sge ss = {(uintptr_t)src, sizeof(src), smr->lkey};
	struct ibv_send_wr swr = {0}, *sbad;
	swr.wr_id = 7;
	swr.sg_list = &ss;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND_WITH_IMM;
	swr.imm_data = htonl(0x1234);
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.qp_type.xrc.remote_srqn = srqn;
	EXPECT_RC(ibv_post_send(ini, &swr, &sbad), 0);
	int got_send = 0, got_recv = 0;
	for (int n = 0; n < 2; n++) {
		struct ibv_wc wc = poll1(cq);
		CHECK(wc.status == IBV_WC_SUCCESS, "wc %d: %s", n, ibv_wc_status_str(wc.status));
		if (wc.opcode == IBV_WC_RECV) {
			CHECK(wc.wr_id == 42 && wc.byte_len == 3000 && wc.qp_num == tgt->qp_num &&
				      ntohl(wc.imm_data) == 0x1234,
			      "receive completion");
			got_recv++;
		} else {
			CHECK(wc.wr_id == 7 && wc.qp_num == ini->qp_num, "send completion");
			got_send++;
		}
	}
	CHECK(got_send == 1 && got_recv == 1, "one send and one receive");
	CHECK(memcmp(dst, src, 3000) == 0, "payload");

	/* --- closing: one reference at a time; the last one waits for users --- */
	EXPECT_RC(ibv_close_xrcd(x1), 0);
	EXPECT_RC(ibv_close_xrcd(x2), EBUSY);
	EXPECT_RC(ibv_destroy_qp(tgt), 0);
	EXPECT_RC(ibv_destroy_srq(srq), 0);
	EXPECT_RC(ibv_close_xrcd(x2), 0);
	xa.oflags = 0;
	EXPECT_NULL_ERRNO(ibv_open_xrcd(ctx, &xa), EINVAL); /* gone with its last close */
	close(fd);
	unlink(path);
	printf("ALL OK\n");
	return 0;
}
