/* mpi_check: what an MPI application does, every byte checked.
 *   point-to-point from 0 B to 16 MiB (rank 0 to each other rank and back),
 *   non-blocking and wildcard (MPI_ANY_SOURCE, MPI_ANY_TAG) receives,
 *   one-sided MPI_Put, MPI_Get and MPI_Accumulate in a window (fence),
 *   MPI_Allreduce, MPI_Alltoall, MPI_Bcast, MPI_Barrier.
 * Arguments: the largest point-to-point message (default 16 MiB; 8 MiB over
 * libfabric's verbs provider on a device like kernel rxe 6.1: the provider
 * takes the port's max_msg_sz, 8 MiB on kernel rxe up to Linux 6.13), and
 * "no-rma" to leave out the one-sided part (Open MPI 5 over libfabric has no
 * one-sided component that runs without shared memory or TCP: osc pt2pt is
 * gone, and osc rdma over btl ofi fails MPI_Win_allocate with any provider,
 * libfabric's tcp included).
 * Each rank prints "rank R of N: ok" or "rank R of N: FAIL <what>"; exit 0 on
 * success.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, bad;
static size_t max_p2p = 16u << 20;

static void check(int ok, const char *what)
{
	if (!ok && !bad) {
		printf("rank %d of %d: FAIL %s\n", rank, size, what);
		bad = 1;
	}
}

static unsigned char pat(size_t i, size_t n, int from)
{
	return (unsigned char)(i * 131 + n * 7 + from * 17 + 1);
}

static void p2p(void)
{
	for (size_t n = 0; n <= max_p2p; n = n ? n * 2 : 1) {
		unsigned char *b = malloc(n ? n : 1);
		if (rank == 0) {
			for (int p = 1; p < size; p++) {
				for (size_t i = 0; i < n; i++)
					b[i] = pat(i, n, 0);
				MPI_Send(b, (int)n, MPI_BYTE, p, 7, MPI_COMM_WORLD);
				MPI_Recv(b, (int)n, MPI_BYTE, p, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < n; i++)
					if (b[i] != pat(i, n, p)) {
						check(0, "p2p reply bytes");
						break;
					}
			}
		} else {
			MPI_Recv(b, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (size_t i = 0; i < n; i++)
				if (b[i] != pat(i, n, 0)) {
					check(0, "p2p bytes");
					break;
				}
			for (size_t i = 0; i < n; i++)
				b[i] = pat(i, n, rank);
			MPI_Send(b, (int)n, MPI_BYTE, 0, 8, MPI_COMM_WORLD);
		}
		free(b);
	}
}

/* Every rank sends one message to every other rank, non-blocking; receives
 * are posted with wildcards and matched by what the message says. */
static void nonblocking_wildcard(void)
{
	const int n = 100000;
	int *out = malloc(sizeof(int) * n), *in = malloc(sizeof(int) * n * size);
	MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * size);
	int k = 0;
	for (int i = 0; i < n; i++)
		out[i] = rank * 1000003 + i;
	for (int p = 0; p < size; p++)
		if (p != rank)
			MPI_Irecv(in + (size_t)n * p, n, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG,
				  MPI_COMM_WORLD, &rq[k++]);
	for (int p = 0; p < size; p++)
		if (p != rank)
			MPI_Isend(out, n, MPI_INT, p, 100 + rank, MPI_COMM_WORLD, &rq[k++]);
	MPI_Status *st = malloc(sizeof(MPI_Status) * k);
	MPI_Waitall(k, rq, st);
	int seen = 0;
	for (int j = 0; j < size - 1; j++) {
		int src = st[j].MPI_SOURCE, *b = in + (size_t)n * (rank == 0 ? j + 1 : (j < rank ? j : j + 1));
		(void)src;
		check(st[j].MPI_TAG == 100 + src, "wildcard tag");
		int from = b[0] / 1000003;
		check(from == src, "wildcard source matches the data");
		for (int i = 0; i < n; i++)
			if (b[i] != from * 1000003 + i) {
				check(0, "non-blocking bytes");
				break;
			}
		seen |= 1 << from;
	}
	check(seen == (((1 << size) - 1) & ~(1 << rank)), "one message from every rank");
	free(out);
	free(in);
	free(rq);
	free(st);
}

static void one_sided(void)
{
	const int n = 1 << 16;
	long *w;
	MPI_Win win;
	MPI_Win_allocate(sizeof(long) * n, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &w, &win);
	for (int i = 0; i < n; i++)
		w[i] = -1;
	long *src = malloc(sizeof(long) * n), *got = malloc(sizeof(long) * n);
	for (int i = 0; i < n; i++)
		src[i] = (long)rank << 32 | i;
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	MPI_Win_fence(0, win);
	MPI_Put(src, n, MPI_LONG, right, 0, n, MPI_LONG, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < n; i++)
		if (w[i] != ((long)left << 32 | i)) {
			check(0, "MPI_Put bytes");
			break;
		}
	MPI_Get(got, n, MPI_LONG, right, 0, n, MPI_LONG, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < n; i++)
		if (got[i] != ((long)rank << 32 | i)) {
			check(0, "MPI_Get bytes");
			break;
		}
	for (int i = 0; i < n; i++)
		w[i] = 0;
	MPI_Win_fence(0, win);
	long one[64];
	for (int i = 0; i < 64; i++)
		one[i] = rank + 1;
	for (int p = 0; p < size; p++)
		MPI_Accumulate(one, 64, MPI_LONG, p, 0, 64, MPI_LONG, MPI_SUM, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < 64; i++)
		check(w[i] == (long)size * (size + 1) / 2, "MPI_Accumulate sum");
	MPI_Win_free(&win);
	free(src);
	free(got);
}

static void collectives(void)
{
	long v = rank + 1, s = 0;
	MPI_Allreduce(&v, &s, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	check(s == (long)size * (size + 1) / 2, "MPI_Allreduce");
	int *a = malloc(sizeof(int) * size * 1000), *b = malloc(sizeof(int) * size * 1000);
	for (int p = 0; p < size; p++)
		for (int i = 0; i < 1000; i++)
			a[p * 1000 + i] = rank * 100000 + p * 1000 + i;
	MPI_Alltoall(a, 1000, MPI_INT, b, 1000, MPI_INT, MPI_COMM_WORLD);
	for (int p = 0; p < size; p++)
		for (int i = 0; i < 1000; i++)
			if (b[p * 1000 + i] != p * 100000 + rank * 1000 + i) {
				check(0, "MPI_Alltoall");
				p = size;
				break;
			}
	size_t n = 1 << 20;
	unsigned char *c = malloc(n);
	for (size_t i = 0; i < n; i++)
		c[i] = rank == 0 ? pat(i, n, 9) : 0;
	MPI_Bcast(c, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
	for (size_t i = 0; i < n; i++)
		if (c[i] != pat(i, n, 9)) {
			check(0, "MPI_Bcast");
			break;
		}
	MPI_Barrier(MPI_COMM_WORLD);
	free(a);
	free(b);
	free(c);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	MPI_Init(&argc, &argv);
	if (argc > 1)
		max_p2p = strtoul(argv[1], NULL, 0);
	int rma = !(argc > 2 && strcmp(argv[2], "no-rma") == 0);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	p2p();
	nonblocking_wildcard();
	if (rma)
		one_sided();
	collectives();
	if (!bad)
		printf("rank %d of %d: ok\n", rank, size);
	int any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	MPI_Finalize();
	return any;
}
