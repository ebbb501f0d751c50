/* A READ whose responses its responder places (read_placed.c) stops
 * being placed when the READ can no longer take them: once
 * ibv_dereg_mr of its destination MR, ibv_modify_qp to ERR or
 * ibv_destroy_qp of its QP has returned, the responder writes nothing
 * more into the destination (local-link: Inbox::end_read_hints).
 *
 * A READs 4 MiB (4,096 responses at path MTU 1024) from B into an MR
 * of local write access whose pages another MR of A's keeps in shared
 * memory (so that they stay shared after a deregistration, and a late
 * placement would show). As soon as the first bytes arrive, A
 * deregisters that MR, moves the QP to ERR, or destroys it; then it
 * fills the destination with 0x77, waits 50 ms (B places 4 MiB in a few
 * milliseconds) and checks that every byte is still 0x77. Eight rounds
 * of each, each on a new pair of QPs, and more (up to 64) until in one
 * the responder had placed some but not all responses when it stopped
 * (the call cut the READ short: a round where all were placed before
 * the call shows nothing); a mode that never cuts one fails. A READ that is not
 * destroyed must complete (any status) and the QP go on or fail as the
 * verbs say: a deregistered destination fails the READ with
 * IBV_WC_LOC_PROT_ERR (unless all of it had arrived), a QP in ERR
 * flushes it.
 * Prints "ALL OK" at the end. */
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define LEN (4L << 20)
#define RESPONSES (LEN / 1024)
#define ROUNDS 8
#define MAX_ROUNDS 64

enum mode { DEREG, ERR, DESTROY, MODES };
static const char *const names[MODES] = {"dereg_mr", "modify_qp to ERR", "destroy_qp"};

static unsigned char byte(long j)
{
	return 0x80 | ((j * 7 + j / 4096) & 0x7f);
}

/* A new RC QP on `s`'s PD and CQ, connected to the other side's new QP. */
static struct ibv_qp *new_qp(const struct side *s)
{
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	ia.send_cq = ia.recv_cq = s->cq;
	struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
	CHECK(qp, "create_qp");
	uint32_t me = qp->qp_num, peer;
	put(s->out, &me, sizeof(me));
	get(s->in, &peer, sizeof(peer));
	union ibv_gid gid = s->gid;
	connect_qp(qp, peer, &gid);
	char c = 0;
	put(s->out, &c, 1);
	get(s->in, &c, 1);
	return qp;
}

static void pause_ms(long ms)
{
	struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

int main(void)
{
	struct side sd = two_processes();
	int in = sd.in, out = sd.out;
	char c = 0;

	if (sd.is_b) {
		unsigned char *src = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(src != MAP_FAILED, "mmap");
		for (long j = 0; j < LEN; j++)
			src[j] = byte(j);
		struct ibv_mr *mr = ibv_reg_mr(sd.pd, src, LEN,
					       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		CHECK(mr, "reg_mr");
		meet(&sd, mr->rkey, (uintptr_t)src);
		/* Each round: a new QP, kept until A says the round is over. */
		while (read(in, &c, 1) == 1) {
			struct ibv_qp *qp = new_qp(&sd);
			get(in, &c, 1);
			/* Its READ responses may still be queued: the QP goes,
			 * and what it held with it. */
			EXPECT_RC(ibv_destroy_qp(qp), 0);
			put(out, &c, 1);
		}
		return 0;
	}

	unsigned char *dst = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(dst != MAP_FAILED, "mmap");
	/* Keeps the pages in shared memory when the READ's MR goes. */
	struct ibv_mr *keeper = ibv_reg_mr(sd.pd, dst, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(keeper, "reg_mr");
	struct peer_info peer = meet(&sd, 0, 0);
	int a_slot = sd.qp->qp_num >> 16, b_slot = peer.qpn >> 16;
	CHECK(stat_value(a_slot, "shared_mr_bytes") >= LEN, "the destination's pages did not move");

	long cut[MODES] = {0};
	for (int m = 0; m < MODES; m++) {
		for (int r = 0; r < ROUNDS || (!cut[m] && r < MAX_ROUNDS); r++) {
			put(out, &c, 1);
			struct ibv_qp *qp = new_qp(&sd);
			memset(dst, 0x5a, LEN);
			struct ibv_mr *mr = ibv_reg_mr(sd.pd, dst, LEN, IBV_ACCESS_LOCAL_WRITE);
			CHECK(mr, "reg_mr");
			long before = stat_value(b_slot, "placed_reads");
			uint64_t wr_id = 100 + r;
			post_rdma(qp, IBV_WR_RDMA_READ, wr_id, mr->lkey, (uintptr_t)dst, LEN, peer.rkey,
				  peer.addr);
			/* The first response's bytes, then at once the call. */
			unsigned char want = byte(0);
			CHECK(arrives(dst, &want, 1), "%s round %d: no response arrived", names[m],
			      r);
			switch (m) {
			case DEREG:
				EXPECT_RC(ibv_dereg_mr(mr), 0);
				break;
			case ERR: {
				struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
				EXPECT_RC(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
				break;
			}
			case DESTROY:
				EXPECT_RC(ibv_destroy_qp(qp), 0);
				break;
			}
			memset(dst, 0x77, LEN);
			pause_ms(50);
			long placed = stat_value(b_slot, "placed_reads") - before;
			for (long j = 0; j < LEN; j++)
				CHECK(dst[j] == 0x77,
				      "%s round %d: byte %ld written after the call returned "
				      "(%#x; %ld responses placed)",
				      names[m], r, j, dst[j], placed);
			if (m != DESTROY) {
				struct ibv_wc wc = poll1(sd.cq);
				CHECK(wc.wr_id == wr_id, "%s round %d: completion of wr %lu",
				      names[m], r, (unsigned long)wc.wr_id);
				if (m == DEREG)
					CHECK(wc.status == IBV_WC_SUCCESS ||
						      wc.status == IBV_WC_LOC_PROT_ERR,
					      "dereg_mr round %d: %s", r,
					      ibv_wc_status_str(wc.status));
				else
					CHECK(wc.status == IBV_WC_SUCCESS ||
						      wc.status == IBV_WC_WR_FLUSH_ERR,
					      "modify_qp round %d: %s", r,
					      ibv_wc_status_str(wc.status));
				EXPECT_RC(ibv_destroy_qp(qp), 0);
			}
			if (m == DESTROY) {
				/* A completion it may have queued before it went. */
				struct ibv_wc wc;
				while (ibv_poll_cq(sd.cq, 1, &wc) > 0)
					;
			}
			if (m != DEREG)
				EXPECT_RC(ibv_dereg_mr(mr), 0);
			printf("%s round %d: %ld of %ld responses placed\n", names[m], r, placed,
			       RESPONSES);
			cut[m] += placed > 0 && placed < RESPONSES;
			put(out, &c, 1);
			get(in, &c, 1);
		}
	}
	for (int m = 0; m < MODES; m++)
		CHECK(cut[m] > 0, "%s never cut a READ short: the rounds showed nothing", names[m]);

	close(out);
	int status = 0;
	CHECK(waitpid(sd.b_pid, &status, 0) == sd.b_pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
	printf("ALL OK\n");
	return 0;
}
