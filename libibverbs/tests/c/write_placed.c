/* RDMA WRITEs of several packets into another process of the device that
 * watches memory (local-link/src/place.rs): A writes messages of 2 to 64
 * packets (path MTU 1024) into B's MR, whose whole pages are in shared
 * memory, and B, without calling the library, waits for each message's
 * last bytes and then checks every byte of its buffer:
 * - the message's bytes are all there, in order, and nothing around it
 *   changed;
 * - a message that runs from a shared page into the MR's partial last
 *   page (private: not placeable by A) arrives whole too (B's engine
 *   writes what A could not place);
 * - one message written again and again at one place (each time other
 *   bytes) ends with the last one's;
 * - a WRITE beyond the MR fails for A and changes nothing in B.
 * Prints "ALL OK" at the end (from A, once B has passed too). */
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define PAGES 40
#define SRC_LEN (80 * 1024)

/* One WRITE: where in B's MR (bytes from its start), how long, and the
 * seed of its bytes. */
struct msg {
	long off, len, seed;
};

/* B's MR: from page 1 of its buffer to 100 bytes into page 33 (pages 1-32
 * whole, page 33 partial). */
static long mr_len(long pg)
{
	return 32 * pg + 100;
}

static unsigned char byte(long seed, long j)
{
	/* Never 0x5a (B's fill), and each seed differs from the next at
	 * every byte. */
	return 0x80 | ((seed * 13 + j) & 0x3f);
}

static int nmsgs(long pg, struct msg *m)
{
	int n = 0;
	m[n++] = (struct msg){0, 65536, 1};		     /* 64 packets */
	m[n++] = (struct msg){65536 + 8, 1025, 2};	     /* 2, the last of 1 byte */
	m[n++] = (struct msg){65536 + 2048, 3000, 3};	     /* 3, unaligned */
	m[n++] = (struct msg){32 * pg - 2000, 2100, 4};	     /* into the partial page */
	for (int i = 0; i < 20; i++)			     /* again and again */
		m[n++] = (struct msg){90000, 8192, 10 + i};
	return n;
}

int main(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	struct msg msgs[64];
	int n = nmsgs(pg, msgs);
	struct side sd = two_processes();
	int is_b = sd.is_b, in = sd.in, out = sd.out;
	pid_t b_pid = sd.b_pid;
	struct ibv_pd *pd = sd.pd;
	struct ibv_cq *cq = sd.cq;
	struct ibv_qp *qp = sd.qp;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	uint32_t rkey = 0;
	uint64_t addr = 0;

	unsigned char *buf = NULL;
	struct ibv_mr *mr = NULL;
	if (is_b) {
		buf = mmap(NULL, PAGES * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			   -1, 0);
		CHECK(buf != MAP_FAILED, "mmap");
		memset(buf, 0x5a, PAGES * pg);
		mr = ibv_reg_mr(pd, buf + pg, mr_len(pg), acc);
		CHECK(mr, "reg_mr");
		rkey = mr->rkey;
		addr = (uintptr_t)buf + pg;
	}
	struct peer_info peer = meet(&sd, rkey, addr);
	char c = 0;

	if (!is_b) {
		static unsigned char src[SRC_LEN];
		struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), acc);
		CHECK(smr, "reg_mr src");
		for (int i = 0; i < n; i++) {
			for (long j = 0; j < msgs[i].len; j++)
				src[j] = byte(msgs[i].seed, j);
			struct ibv_wc wc = rdma(qp, cq, IBV_WR_RDMA_WRITE, smr->lkey,
						(uintptr_t)src, msgs[i].len, peer.rkey,
						peer.addr + msgs[i].off);
			CHECK(wc.status == IBV_WC_SUCCESS, "WRITE %d: %s", i,
			      ibv_wc_status_str(wc.status));
			get(in, &c, 1); /* B saw it */
		}
		/* Two packets, the second past the MR's end. */
		struct ibv_wc wc = rdma(qp, cq, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src, 2048,
					peer.rkey, peer.addr + mr_len(pg) - 1024);
		CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "WRITE past the MR: %s",
		      ibv_wc_status_str(wc.status));
		put(out, &c, 1);
		get(in, &c, 1); /* B is done */
		int status = 0;
		CHECK(waitpid(b_pid, &status, 0) == b_pid, "waitpid");
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
		printf("ALL OK\n");
		return 0;
	}

	/* B: what its buffer should hold. */
	unsigned char *want = malloc(PAGES * pg);
	CHECK(want, "malloc");
	memset(want, 0x5a, PAGES * pg);
	unsigned char *mine = buf + pg;
	for (int i = 0; i < n; i++) {
		for (long j = 0; j < msgs[i].len; j++)
			want[pg + msgs[i].off + j] = byte(msgs[i].seed, j);
		long tail = msgs[i].off + msgs[i].len - 8;
		CHECK(arrives(mine + tail, want + pg + tail, 8), "WRITE %d never showed", i);
		for (long k = 0; k < PAGES * pg; k++)
			CHECK(buf[k] == want[k], "WRITE %d: byte %ld of the buffer is %#x, not %#x", i,
			      k, buf[k], want[k]);
		put(out, &c, 1);
	}
	get(in, &c, 1); /* A's WRITE past the MR failed */
	for (long k = 0; k < PAGES * pg; k++)
		CHECK(buf[k] == want[k], "after the failed WRITE: byte %ld is %#x, not %#x", k,
		      buf[k], want[k]);
	EXPECT_RC(ibv_dereg_mr(mr), 0);
	for (long k = 0; k < PAGES * pg; k++)
		CHECK(buf[k] == want[k], "after dereg: byte %ld is %#x, not %#x", k, buf[k],
		      want[k]);
	put(out, &c, 1);
	EXPECT_RC(ibv_destroy_qp(qp), 0);
	return 0;
}
