/* A sender places (local-link/src/place.rs) only packets of the last work
 * request posted (rxe_core::Transmit::last_posted), and a chain given to
 * one ibv_post_send is posted whole before its packets leave, as kernel
 * rxe's provider writes every WQE and then rings the doorbell once.
 *
 * A writes 4-packet messages (path MTU 1024) into B's MR, whose pages are
 * in shared memory, and reads its own placed_writes from the daemon's
 * STAT after each:
 * - a WRITE posted alone is placed (in at least one of the rounds: B's
 *   responder must have published that it is ready);
 * - the same WRITE at the head of a chain, with a 64-byte WRITE behind
 *   it, is never placed: at most 1 packet of the chain is (the 64-byte
 *   WRITE, if B took the first before A pushed it);
 * - so too in an ibv_wr_start ... ibv_wr_complete batch (on a second QP,
 *   created with ibv_create_qp_ex), which is posted whole at
 *   ibv_wr_complete;
 * - a chain whose second WR is refused (more SGEs than the QP allows)
 *   posts the first, sends it, and names the second in bad_wr.
 * B checks that every byte arrived. Prints "ALL OK" at the end. */
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define ROUNDS 8
#define WR_ROUNDS 4
#define BIG 4096
#define SMALL 64
#define LEN (BIG + SMALL)

static unsigned char byte(long r, long j)
{
	return 0x80 | ((r * 7 + j) & 0x7f);
}

/* Round `r`'s bytes into buf[0..LEN). */
static void fill(unsigned char *buf, long r)
{
	for (long j = 0; j < LEN; j++)
		buf[j] = byte(r, j);
}

/* A 4-packet WRITE of buf[0..BIG) to `peer_addr`, posted alone on `qp`
 * and acknowledged: how many packets the sender placed. */
static long write_alone(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *mr,
			unsigned char *buf, uint32_t rkey, uint64_t peer_addr, int slot)
{
	long before = stat_value(slot, "placed_writes");
	struct ibv_wc wc =
		rdma(qp, cq, IBV_WR_RDMA_WRITE, mr->lkey, (uintptr_t)buf, BIG, rkey, peer_addr);
	CHECK(wc.status == IBV_WC_SUCCESS, "alone: %s", ibv_wc_status_str(wc.status));
	return stat_value(slot, "placed_writes") - before;
}

/* The completions of WRs 1 and 2, in order, both successful. */
static void poll_two(struct ibv_cq *cq, const char *what)
{
	for (int k = 1; k <= 2; k++) {
		struct ibv_wc wc = poll1(cq);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)k, "%s: WR %llu %s",
		      what, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	}
}

int main(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	struct side sd = two_processes();
	int is_b = sd.is_b, in = sd.in, out = sd.out;
	struct ibv_pd *pd = sd.pd;
	struct ibv_cq *cq = sd.cq;
	struct ibv_qp *qp = sd.qp;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	long buf_len = 4 * pg;
	unsigned char *buf = mmap(NULL, buf_len, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED, "mmap");
	memset(buf, 0x5a, buf_len);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, buf_len, acc);
	CHECK(mr, "reg_mr");
	struct peer_info peer = meet(&sd, mr->rkey, (uintptr_t)buf);
	char c = 0;
	/* A second QP each, connected to each other: A's through the
	 * ibv_wr_* API. */
	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *qp2 = ibv_create_qp_ex(sd.ctx, &qa);
	CHECK(qp2, "create_qp_ex");
	uint32_t qpn2 = qp2->qp_num, peer_qpn2 = 0;
	put(out, &qpn2, sizeof(qpn2));
	get(in, &peer_qpn2, sizeof(peer_qpn2));
	union ibv_gid gid = sd.gid;
	connect_qp(qp2, peer_qpn2, &gid);
	put(out, &c, 1);
	get(in, &c, 1);

	if (is_b) {
		/* Each round: A's two WRITEs (alone, then chained) end with
		 * the bytes of the round. */
		for (int r = 0; r < ROUNDS + WR_ROUNDS; r++) {
			get(in, &c, 1);
			for (long j = 0; j < LEN; j++)
				CHECK(buf[j] == byte(r, j), "round %d: byte %ld is %#x, not %#x", r,
				      j, buf[j], byte(r, j));
			put(out, &c, 1);
		}
		get(in, &c, 1);
		return 0;
	}

	int slot = qp->qp_num >> 16;
	struct ibv_sge big = {.addr = (uintptr_t)buf, .length = BIG, .lkey = mr->lkey};
	struct ibv_sge small = {.addr = (uintptr_t)buf + BIG, .length = SMALL, .lkey = mr->lkey};
	struct ibv_send_wr w1 = {0}, w2 = {0}, *bad = NULL;
	w1.wr_id = 1;
	w1.sg_list = &big;
	w1.num_sge = 1;
	w1.opcode = IBV_WR_RDMA_WRITE;
	w1.send_flags = IBV_SEND_SIGNALED;
	w1.wr.rdma.rkey = peer.rkey;
	w1.wr.rdma.remote_addr = peer.addr;
	w2 = w1;
	w2.wr_id = 2;
	w2.sg_list = &small;
	w2.wr.rdma.remote_addr = peer.addr + BIG;
	long alone_placed[ROUNDS], chain_placed[ROUNDS];
	int any_alone = 0;
	for (int r = 0; r < ROUNDS; r++) {
		/* Alone: the 4 packets, then the 64 bytes, each acknowledged
		 * before the next. */
		fill(buf, r + 100);
		alone_placed[r] = write_alone(qp, cq, mr, buf, peer.rkey, peer.addr, slot);
		any_alone |= alone_placed[r] > 0;
		/* Chained: the same 4 packets with the 64 bytes behind them. */
		fill(buf, r);
		long before = stat_value(slot, "placed_writes");
		w1.next = &w2;
		w2.next = NULL;
		EXPECT_RC(ibv_post_send(qp, &w1, &bad), 0);
		poll_two(cq, "chain");
		chain_placed[r] = stat_value(slot, "placed_writes") - before;
		put(out, &c, 1);
		get(in, &c, 1); /* B has the round's bytes */
	}
	for (int r = 0; r < ROUNDS; r++)
		printf("round %d: placed alone %ld, chained %ld\n", r, alone_placed[r],
		       chain_placed[r]);
	CHECK(any_alone, "no WRITE posted alone was placed: nothing here tests the chain");
	for (int r = 0; r < ROUNDS; r++)
		CHECK(chain_placed[r] <= 1, "round %d: %ld packets of the chain were placed", r,
		      chain_placed[r]);

	/* The same through an ibv_wr_* batch on the second QP. */
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp2);
	CHECK(x, "qp_to_qp_ex");
	int any_alone2 = 0;
	for (int r = ROUNDS; r < ROUNDS + WR_ROUNDS; r++) {
		fill(buf, r + 100);
		any_alone2 |= write_alone(qp2, cq, mr, buf, peer.rkey, peer.addr, slot) > 0;
		fill(buf, r);
		long before = stat_value(slot, "placed_writes");
		ibv_wr_start(x);
		x->wr_id = 1;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, peer.rkey, peer.addr);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, BIG);
		x->wr_id = 2;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, peer.rkey, peer.addr + BIG);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + BIG, SMALL);
		EXPECT_RC(ibv_wr_complete(x), 0);
		poll_two(cq, "batch");
		long placed = stat_value(slot, "placed_writes") - before;
		printf("batch round %d: placed %ld\n", r, placed);
		CHECK(placed <= 1, "round %d: %ld packets of the batch were placed", r, placed);
		put(out, &c, 1);
		get(in, &c, 1); /* B has the round's bytes */
	}
	CHECK(any_alone2, "no WRITE posted alone on the second QP was placed");

	/* A chain whose second WR is refused: the first is posted and
	 * completes; bad_wr names the second. */
	struct ibv_sge many[2] = {big, small};
	struct ibv_send_wr wide = w2;
	wide.wr_id = 3;
	wide.sg_list = many;
	wide.num_sge = 2; /* the QP allows 1 */
	w1.next = &wide;
	wide.next = NULL;
	bad = NULL;
	CHECK(ibv_post_send(qp, &w1, &bad) != 0, "a WR of 2 SGEs on a QP of max_send_sge 1");
	CHECK(bad == &wide, "bad_wr is not the refused WR");
	struct ibv_wc wc = poll1(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "the WR before it: %llu %s",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	put(out, &c, 1);
	int status = 0;
	CHECK(waitpid(sd.b_pid, &status, 0) == sd.b_pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
	printf("ALL OK\n");
	return 0;
}
