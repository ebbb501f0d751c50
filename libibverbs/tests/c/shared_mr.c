/* Registered memory in shared memory (local-link/src/shared_mr.rs), seen
 * from an application: two processes of one device, A writing into B's
 * MR while B watches memory without calling the library.
 * - B's MR's whole pages move into a memfd at registration, contents
 *   kept; its partial first and last pages stay private;
 * - A's WRITEs arrive while B only spins on memory;
 * - a child that B forks gets a private copy: its write stays its own;
 * - B deregisters as soon as it sees A's second WRITE in memory, maybe
 *   before a thread of its own has read that WRITE's packet: the WRITE
 *   still succeeds for A (deregistration has B's engine take the packets
 *   of placements into the MR first);
 * - after deregistration the pages are private again, contents kept;
 * - a buffer registered while the application has a second thread does
 *   not move.
 * Prints "ALL OK" at the end (from A, once B has passed too). */
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* Whether the page holding `p` is mapped from rxe-emu's memfd. */
static int in_memfd(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f, "maps");
	char line[512];
	uintptr_t a = (uintptr_t)p;
	int r = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s <= a && a < e) {
			r = strstr(line, "rxe-emu-mr") != NULL;
			break;
		}
	}
	fclose(f);
	return r;
}

static void *blocked(void *arg)
{
	char c;
	while (read(*(int *)arg, &c, 1) > 0)
		;
	return NULL;
}

static const char first[64] = "placed by A while B watched memory ........................";
static const char second[64] = "and again after B forked a child ...........................";

int main(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	struct side sd = two_processes();
	int is_b = sd.is_b, in = sd.in, out = sd.out;
	pid_t b_pid = sd.b_pid;
	struct ibv_pd *pd = sd.pd;
	struct ibv_cq *cq = sd.cq;
	struct ibv_qp *qp = sd.qp;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	uint32_t rkey = 0;
	uint64_t addr = 0;

	char *buf = NULL;
	struct ibv_mr *mr = NULL;
	if (is_b) {
		/* Four pages; the MR starts 100 bytes into page 0 and ends
		 * with page 2: pages 1 and 2 are whole, page 0 partial. */
		buf = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(buf != MAP_FAILED, "mmap");
		memset(buf, 0x5a, 4 * pg);
		mr = ibv_reg_mr(pd, buf + 100, 3 * pg - 100, acc);
		CHECK(mr, "reg_mr");
		CHECK(in_memfd(buf + pg) && in_memfd(buf + 2 * pg), "whole pages moved");
		CHECK(!in_memfd(buf) && !in_memfd(buf + 3 * pg), "the partial page stayed");
		for (long i = 0; i < 4 * pg; i++)
			CHECK(buf[i] == 0x5a, "contents kept at %ld", i);
		rkey = mr->rkey;
		addr = (uintptr_t)buf + pg;
	}
	struct peer_info peer = meet(&sd, rkey, addr);
	char c = 0;

	if (!is_b) {
		static char src[128];
		memcpy(src, first, 64);
		memcpy(src + 64, second, 64);
		struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), acc);
		CHECK(smr, "reg_mr src");
		struct ibv_wc wc = rdma(qp, cq, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src, 64,
					peer.rkey, peer.addr + 8);
		CHECK(wc.status == IBV_WC_SUCCESS, "first WRITE: %s", ibv_wc_status_str(wc.status));
		get(in, &c, 1); /* B forked */
		wc = rdma(qp, cq, IBV_WR_RDMA_WRITE, smr->lkey, (uintptr_t)src + 64, 64, peer.rkey,
			  peer.addr + 200);
		CHECK(wc.status == IBV_WC_SUCCESS, "second WRITE: %s", ibv_wc_status_str(wc.status));
		get(in, &c, 1); /* B is done */
		EXPECT_RC(ibv_dereg_mr(smr), 0);
		EXPECT_RC(ibv_destroy_qp(qp), 0);
		int status = 0;
		CHECK(waitpid(b_pid, &status, 0) == b_pid, "waitpid");
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
		printf("ALL OK\n");
		return 0;
	}

	char *mine = buf + pg;
	CHECK(arrives(mine + 8, first, 64), "first WRITE never showed in memory");

	fflush(stdout);
	pid_t child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		int ok = !in_memfd(mine) && memcmp(mine + 8, first, 64) == 0 && mine[500] == 0x5a;
		mine[500] = 0x11;
		_exit(ok ? 0 : 1);
	}
	int status = 0;
	CHECK(waitpid(child, &status, 0) == child, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child saw shared or wrong pages");
	CHECK(mine[500] == 0x5a, "the child's write reached the parent");
	CHECK(in_memfd(mine), "still shared in the parent");
	put(out, &c, 1);
	CHECK(arrives(mine + 200, second, 64), "second WRITE never showed in memory");

	EXPECT_RC(ibv_dereg_mr(mr), 0);
	CHECK(!in_memfd(mine) && !in_memfd(mine + pg), "private again after dereg");
	CHECK(memcmp(mine + 8, first, 64) == 0 && memcmp(mine + 200, second, 64) == 0,
	      "contents kept after dereg");
	CHECK(buf[0] == 0x5a && buf[4 * pg - 1] == 0x5a, "pages around untouched");

	/* With a second application thread nothing moves. */
	int hold[2];
	CHECK(pipe(hold) == 0, "pipe");
	pthread_t t;
	CHECK(pthread_create(&t, NULL, blocked, &hold[0]) == 0, "pthread_create");
	char *two = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(two != MAP_FAILED, "mmap");
	struct ibv_mr *mr2 = ibv_reg_mr(pd, two, 2 * pg, acc);
	CHECK(mr2, "reg_mr with a thread");
	CHECK(!in_memfd(two), "moved while another thread ran");
	close(hold[1]);
	pthread_join(t, NULL);
	EXPECT_RC(ibv_dereg_mr(mr2), 0);

	put(out, &c, 1);
	EXPECT_RC(ibv_destroy_qp(qp), 0);
	return 0;
}
