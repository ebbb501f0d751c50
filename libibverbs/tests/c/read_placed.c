/* READ responses placed by their responder (local-link/src/place.rs,
 * Inbox::place_read_and_push), as kernel rxe's loopback runs the
 * requester's completer in the responder's context.
 *
 * A READs from B's MR into an MR of its own with local write access only
 * (its pages move into shared memory too: shared_mr_bytes), path MTU
 * 1024, and reads B's placed_reads from the daemon's STAT around each:
 * - READs of 4,396 bytes (five responses, the last of 300 bytes): placed
 *   by B (all five in at least one round: B must have taken the request
 *   as new; never more than five), every byte where it belongs and the
 *   bytes around the destination untouched;
 * - 4,196 bytes (a last response of 100 bytes, too short for B's engine
 *   to leave in memory): at most four placed, every byte right;
 * - 100 bytes: nothing placed (no hint), every byte right;
 * - a READ into an MR without local write access fails with
 *   IBV_WC_LOC_PROT_ERR, nothing placed and nothing written.
 * Prints "ALL OK" at the end. */
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define ROUNDS 6
#define SRC_LEN 8192
#define AT 512 /* where in A's MR a READ lands */

static unsigned char byte(long r, long j)
{
	return 0x80 | ((r * 13 + j) & 0x7f);
}

/* A READ of `len` bytes of B's round-`r` bytes into dst[AT..], checked
 * (the READ succeeds, the bytes arrive, the bytes around them stay 0x5a):
 * how many responses B placed. */
static long read_round(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *mr,
		       unsigned char *dst, long dst_len, struct peer_info *peer, int b_slot,
		       long r, uint32_t len)
{
	memset(dst, 0x5a, dst_len);
	long before = stat_value(b_slot, "placed_reads");
	struct ibv_wc wc = rdma(qp, cq, IBV_WR_RDMA_READ, mr->lkey, (uintptr_t)dst + AT, len,
				peer->rkey, peer->addr);
	CHECK(wc.status == IBV_WC_SUCCESS, "READ of %u: %s", len, ibv_wc_status_str(wc.status));
	long placed = stat_value(b_slot, "placed_reads") - before;
	for (long j = 0; j < dst_len; j++) {
		int inside = j >= AT && j < AT + (long)len;
		unsigned char want = inside ? byte(r, j - AT) : 0x5a;
		CHECK(dst[j] == want, "READ of %u, round %ld: byte %ld is %#x, not %#x", len, r, j,
		      dst[j], want);
	}
	return placed;
}

int main(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	struct side sd = two_processes();
	int is_b = sd.is_b, in = sd.in, out = sd.out;
	char c = 0;

	if (is_b) {
		unsigned char *src = mmap(NULL, SRC_LEN, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(src != MAP_FAILED, "mmap");
		struct ibv_mr *mr = ibv_reg_mr(sd.pd, src, SRC_LEN,
					       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		CHECK(mr, "reg_mr");
		meet(&sd, mr->rkey, (uintptr_t)src);
		/* Each round: A asks for round r's bytes. */
		long r;
		while (read(in, &r, sizeof(r)) == (ssize_t)sizeof(r)) {
			for (long j = 0; j < SRC_LEN; j++)
				src[j] = byte(r, j);
			put(out, &c, 1);
		}
		return 0;
	}

	long dst_len = 4 * pg;
	unsigned char *dst = mmap(NULL, dst_len, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(dst != MAP_FAILED, "mmap");
	/* Local write only: a READ's destination, which no peer may write
	 * but the responses of our READs. */
	struct ibv_mr *mr = ibv_reg_mr(sd.pd, dst, dst_len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct peer_info peer = meet(&sd, 0, 0);
	int a_slot = sd.qp->qp_num >> 16, b_slot = peer.qpn >> 16;
	long shared = stat_value(a_slot, "shared_mr_bytes");
	CHECK(shared >= dst_len, "the READ destination's pages did not move: %ld bytes", shared);

	long r = 0;
	long whole[ROUNDS], short_last[ROUNDS], tiny[ROUNDS];
	int all_five = 0;
	for (int i = 0; i < ROUNDS; i++) {
		long n[3];
		uint32_t lens[3] = {4396, 4196, 100};
		for (int k = 0; k < 3; k++) {
			r++;
			put(out, &r, sizeof(r));
			get(in, &c, 1); /* B has the round's bytes */
			n[k] = read_round(sd.qp, sd.cq, mr, dst, dst_len, &peer, b_slot, r, lens[k]);
		}
		whole[i] = n[0];
		short_last[i] = n[1];
		tiny[i] = n[2];
		all_five |= whole[i] == 5;
	}
	for (int i = 0; i < ROUNDS; i++)
		printf("round %d: placed %ld of 5, %ld of 5, %ld of 1\n", i, whole[i],
		       short_last[i], tiny[i]);
	CHECK(all_five, "no READ had all its responses placed");
	for (int i = 0; i < ROUNDS; i++) {
		CHECK(whole[i] <= 5, "round %d: %ld placed of 5 responses", i, whole[i]);
		CHECK(short_last[i] <= 4, "round %d: %ld placed, the last unplaceable", i,
		      short_last[i]);
		CHECK(tiny[i] == 0, "round %d: a READ of 100 bytes placed", i);
	}

	/* Into an MR without local write access: a local protection error,
	 * nothing placed, nothing written (the QP then goes to ERR). */
	unsigned char *ro = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
	CHECK(ro != MAP_FAILED, "mmap");
	memset(ro, 0x33, pg);
	struct ibv_mr *ro_mr = ibv_reg_mr(sd.pd, ro, pg, 0);
	CHECK(ro_mr, "reg_mr without access");
	r++;
	put(out, &r, sizeof(r));
	get(in, &c, 1);
	long before = stat_value(b_slot, "placed_reads");
	struct ibv_wc wc = rdma(sd.qp, sd.cq, IBV_WR_RDMA_READ, ro_mr->lkey, (uintptr_t)ro, 2048,
				peer.rkey, peer.addr);
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR, "READ into a read-only MR: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(stat_value(b_slot, "placed_reads") == before, "a response placed into it");
	for (long j = 0; j < pg; j++)
		CHECK(ro[j] == 0x33, "byte %ld of the read-only MR is %#x", j, ro[j]);

	close(out);
	int status = 0;
	CHECK(waitpid(sd.b_pid, &status, 0) == sd.b_pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
	printf("ALL OK\n");
	return 0;
}
