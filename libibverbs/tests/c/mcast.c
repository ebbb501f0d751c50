/* UD multicast through libibverbs, as an application writes it.
 *
 *   mcast recv GROUP N   attach a UD QP to GROUP (an IPv4 class D address),
 *                        print READY, take N messages, check each byte, the
 *                        immediate, the source QPN and the GRH; then check
 *                        that ibv_destroy_qp is EBUSY while attached and
 *                        that a second ibv_detach_mcast is EINVAL.
 *   mcast send GROUP N   send N UD messages to GROUP (QPN 0xFFFFFF).
 *
 * Exit 0 and a last line "OK ..." on success; "FAIL: why" and exit 1 else.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QKEY 0x11223344u
#define MSG 700
#define SLOT (MSG + 40)

static void fail(const char *why, int e)
{
	printf("FAIL: %s (%d %s)\n", why, e, strerror(e));
	exit(1);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned char pat(int msg, int i) { return (unsigned char)(msg * 7 + i * 13 + 1); }

int main(int argc, char **argv)
{
	if (argc != 4)
		fail("usage: mcast recv|send GROUP N", EINVAL);
	int recv_side = !strcmp(argv[1], "recv");
	int n = atoi(argv[3]);
	union ibv_gid group = {0};
	group.raw[10] = group.raw[11] = 0xff;
	if (inet_pton(AF_INET, argv[2], &group.raw[12]) != 1)
		fail("bad group", EINVAL);

	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("no device", errno);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * n + 4, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = {.max_send_wr = n + 1, .max_recv_wr = n + 1, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct ibv_qp *qp = pd && cq ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp)
		fail("create pd/cq/qp", errno);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	a.qp_state = IBV_QPS_RTR;
	e = e ? e : ibv_modify_qp(qp, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	e = e ? e : ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	if (e)
		fail("modify_qp", e);
	size_t len = (size_t)SLOT * (n + 1);
	unsigned char *buf = calloc(1, len);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("reg_mr", errno);

	if (recv_side) {
		for (int i = 0; i < n; i++) {
			struct ibv_sge s = {(uintptr_t)(buf + i * SLOT), SLOT, mr->lkey};
			struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
			if ((e = ibv_post_recv(qp, &wr, &bad)))
				fail("post_recv", e);
		}
		union ibv_gid unicast = group;
		unicast.raw[12] = 10;
		if (ibv_attach_mcast(qp, &unicast, 0) != EINVAL)
			fail("attach to a unicast GID must be EINVAL", 0);
		if ((e = ibv_attach_mcast(qp, &group, 0)))
			fail("ibv_attach_mcast", e);
		printf("READY qpn %u\n", qp->qp_num);
		fflush(stdout);
		int got = 0;
		double limit = now() + 20;
		while (got < n) {
			struct ibv_wc wc;
			int k = ibv_poll_cq(cq, 1, &wc);
			if (k < 0)
				fail("poll_cq", k);
			if (k == 0) {
				if (now() > limit)
					fail("timed out waiting for multicast messages", ETIMEDOUT);
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
				fail(ibv_wc_status_str(wc.status), wc.status);
			if (wc.byte_len != MSG + 40 || !(wc.wc_flags & IBV_WC_GRH) || !(wc.wc_flags & IBV_WC_WITH_IMM))
				fail("byte_len or flags", wc.byte_len);
			int m = ntohl(wc.imm_data);
			unsigned char *p = buf + wc.wr_id * SLOT;
			if (memcmp(p + 36, &group.raw[12], 4))
				fail("GRH destination is not the group", 0);
			for (int i = 0; i < MSG; i++)
				if (p[40 + i] != pat(m, i))
					fail("payload differs", i);
			got++;
		}
		if ((e = ibv_destroy_qp(qp)) != EBUSY)
			fail("ibv_destroy_qp while attached must be EBUSY", e);
		if ((e = ibv_detach_mcast(qp, &group, 0)))
			fail("ibv_detach_mcast", e);
		if ((e = ibv_detach_mcast(qp, &group, 0)) != EINVAL)
			fail("second ibv_detach_mcast must be EINVAL", e);
		printf("OK received %d\n", got);
	} else {
		struct ibv_ah_attr aa = {
			.is_global = 1, .port_num = 1,
			.grh = {.dgid = group, .sgid_index = 1, .hop_limit = 1},
		};
		struct ibv_ah *ah = ibv_create_ah(pd, &aa);
		if (!ah)
			fail("create_ah", errno);
		for (int m = 0; m < n; m++) {
			unsigned char *p = buf + m * SLOT;
			for (int i = 0; i < MSG; i++)
				p[i] = pat(m, i);
			struct ibv_sge s = {(uintptr_t)p, MSG, mr->lkey};
			struct ibv_send_wr wr = {
				.wr_id = m, .sg_list = &s, .num_sge = 1,
				.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				.imm_data = htonl(m),
				.wr.ud = {.ah = ah, .remote_qpn = 0xffffff, .remote_qkey = QKEY},
			}, *bad;
			if ((e = ibv_post_send(qp, &wr, &bad)))
				fail("post_send", e);
			struct ibv_wc wc;
			double limit = now() + 10;
			int k;
			while ((k = ibv_poll_cq(cq, 1, &wc)) == 0)
				if (now() > limit)
					fail("send completion timed out", ETIMEDOUT);
			if (k < 0 || wc.status != IBV_WC_SUCCESS)
				fail("send completion", wc.status);
		}
		ibv_destroy_ah(ah);
		printf("OK sent %d\n", n);
	}
	if ((e = ibv_destroy_qp(qp)))
		fail("destroy_qp", e);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
