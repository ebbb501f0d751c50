/*
 * rxe-facts: what a program can see of an RDMA device without a peer, one
 * "name=value" line each: the device and port attributes of ibv_devinfo -v,
 * the FLUSH and ATOMIC WRITE capability bits, the rkey of an MR without
 * remote access, and what ibv_query_qp says of cur_qp_state. The
 * conformance suite runs it on kernel rxe in the guest and on rxe-emu on
 * the host (with the device like that kernel) and compares the lines.
 * Linked against Debian 12's libibverbs, like rxe-interop-peer.
 *
 * Usage: rxe-facts [DEV]   (default: the first device)
 * Exit: 0, or 1 with a message on stderr when a verb fails.
 *
 * Build: cc -O2 -Wall -o rxe-facts rxe-facts.c -libverbs
 */
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
	fprintf(stderr, "rxe-facts: %s failed\n", what);
	exit(1);
}

int main(int argc, char **argv)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_device *d = NULL;
	if (!l)
		die("ibv_get_device_list");
	for (int i = 0; l[i]; i++)
		if (argc < 2 || !strcmp(ibv_get_device_name(l[i]), argv[1])) {
			d = l[i];
			break;
		}
	if (!d)
		die("finding the device");
	struct ibv_context *c = ibv_open_device(d);
	if (!c)
		die("ibv_open_device");
	struct ibv_device_attr_ex x;
	memset(&x, 0, sizeof x);
	if (ibv_query_device_ex(c, NULL, &x))
		die("ibv_query_device_ex");
	struct ibv_device_attr *a = &x.orig_attr;
#define U(f) printf("device." #f "=%" PRIu64 "\n", (uint64_t)a->f)
	U(max_mr_size); U(page_size_cap); U(vendor_id); U(vendor_part_id); U(hw_ver);
	U(max_qp); U(max_qp_wr); U(device_cap_flags); U(max_sge); U(max_sge_rd); U(max_cq);
	U(max_cqe); U(max_mr); U(max_pd); U(max_qp_rd_atom); U(max_ee_rd_atom);
	U(max_res_rd_atom); U(max_qp_init_rd_atom); U(max_ee_init_rd_atom); U(atomic_cap);
	U(max_ee); U(max_rdd); U(max_mw); U(max_raw_ipv6_qp); U(max_raw_ethy_qp);
	U(max_mcast_grp); U(max_mcast_qp_attach); U(max_total_mcast_qp_attach); U(max_ah);
	U(max_fmr); U(max_map_per_fmr); U(max_srq); U(max_srq_wr); U(max_srq_sge);
	U(max_pkeys); U(local_ca_ack_delay); U(phys_port_cnt);
#undef U
	/* IB_UVERBS_DEVICE_FLUSH_GLOBAL (38), _FLUSH_PERSISTENT (39), _ATOMIC_WRITE (40) */
	printf("device.cap_flags_ex.flush_atomic_write=%#" PRIx64 "\n",
	       (uint64_t)(x.device_cap_flags_ex & (7ull << 38)));
	struct ibv_port_attr p;
	if (ibv_query_port(c, 1, &p))
		die("ibv_query_port");
#define P(f) printf("port." #f "=%" PRIu64 "\n", (uint64_t)p.f)
	P(state); P(max_mtu); P(active_mtu); P(gid_tbl_len); P(port_cap_flags); P(max_msg_sz);
	P(bad_pkey_cntr); P(qkey_viol_cntr); P(pkey_tbl_len); P(lid); P(sm_lid); P(lmc);
	P(max_vl_num); P(sm_sl); P(subnet_timeout); P(init_type_reply); P(active_width);
	P(active_speed);
	P(phys_state); P(link_layer);
#undef P
	struct ibv_pd *pd = ibv_alloc_pd(c);
	if (!pd)
		die("ibv_alloc_pd");
	static char buf[4096];
	struct ibv_mr *local = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!local)
		die("ibv_reg_mr (local)");
	printf("mr.local_only.rkey=%s\n",
	       local->rkey == 0 ? "0" : local->rkey == local->lkey ? "lkey" : "other");
	struct ibv_mr *remote = ibv_reg_mr(pd, buf, sizeof buf,
					   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ);
	if (!remote)
		die("ibv_reg_mr (remote)");
	printf("mr.remote.rkey=%s\n",
	       remote->rkey == 0 ? "0" : remote->rkey == remote->lkey ? "lkey" : "other");
	struct ibv_cq *cq = ibv_create_cq(c, 4, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp");
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	if (ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");
	struct ibv_qp_init_attr qi;
	memset(&qa, 0xff, sizeof qa);
	if (ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CUR_STATE, &qi))
		die("ibv_query_qp");
	printf("qp.init.qp_state=%d\nqp.init.cur_qp_state=%d\n", qa.qp_state, qa.cur_qp_state);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(remote);
	ibv_dereg_mr(local);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
	ibv_free_device_list(l);
	return 0;
}
