// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma-mpi-check: an MPI program that proves data moves intact between
 * ranks on different hosts. scripts/guest-stack-image.sh builds it with
 * Debian's mpicc and installs it in the stack image as
 * /usr/bin/vrdma-mpi-check; guest/vrdma-middleware runs it under mpirun
 * with the UCX PML across the two guests of `vrdma-vmtest exec-pair`.
 *
 * Rank 0 and rank 1 ping-pong messages of 1 B to 1 MiB, ITERS times each
 * size (-n ITERS, default 8). Each message carries a pattern that depends on
 * its size, its iteration and its direction, and every byte is checked by the
 * receiver: rank 1 checks the ping and answers with a pong of its own
 * pattern (not an echo), so rank 0's check proves that rank 1 saw the ping.
 * Then every rank contributes known values to an MPI_Allreduce (sum of
 * 64-bit integers and max of the rank), checked element by element on every
 * rank.
 *
 * Unless -l is given, the two ping-pong ranks must run on different hosts
 * (MPI_Get_processor_name): the point is to cross the network.
 *
 * Output, one line per rank and phase (the tests look for "verified"):
 *   vrdma-mpi-check: rank R on HOST: pingpong with rank P on PEER: SIZES sizes 1..1048576 B x ITERS verified (T us per 1 MiB round trip)
 *   vrdma-mpi-check: rank R on HOST: allreduce of N ranks verified
 * A failure prints what differed (rank, size, iteration, offset, got, want)
 * and aborts the job with exit status 1.
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SIZE (1u << 20)
#define MAX_ITERS 10000
#define REDUCE_LEN 4096
#define TAG_PING 17
#define TAG_PONG 18

static const size_t sizes[] = {
	1, 8, 63, 64, 1000, 4096, 8192, 65536, 65537, 262144, MAX_SIZE,
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int rank;
static char host[MPI_MAX_PROCESSOR_NAME];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "vrdma-mpi-check: rank %d on %s: FAILED: ", rank, host);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 1);
	exit(1);
}

/*
 * pattern: the byte at offset off of the message of size len, iteration
 * iter, direction dir (0 ping, 1 pong). A multiplicative mix so that a
 * shifted, truncated or stale buffer (the previous iteration's) differs.
 */
static uint8_t pattern(size_t len, int iter, int dir, size_t off)
{
	uint32_t x = (uint32_t)off * 2654435761u;

	x ^= (uint32_t)len * 40503u + (uint32_t)iter * 97u + (uint32_t)dir * 0x5bd1e995u;
	x ^= x >> 13;
	return (uint8_t)(x ^ (x >> 8));
}

static void fill(uint8_t *buf, size_t len, int iter, int dir)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(len, iter, dir, i);
}

static void check(const uint8_t *buf, size_t len, int iter, int dir, int from)
{
	for (size_t i = 0; i < len; i++) {
		uint8_t want = pattern(len, iter, dir, i);

		if (buf[i] != want)
			fail("%s of %zu B from rank %d, iteration %d: byte %zu is 0x%02x, want 0x%02x",
			     dir ? "pong" : "ping", len, from, iter, i, buf[i], want);
	}
}

static void recv_exact(uint8_t *buf, size_t len, int from, int tag)
{
	MPI_Status st;
	int count;

	/* Posted one byte larger than expected: a longer message shows. */
	MPI_Recv(buf, (int)len + 1, MPI_BYTE, from, tag, MPI_COMM_WORLD, &st);
	MPI_Get_count(&st, MPI_BYTE, &count);
	if (count < 0 || (size_t)count != len)
		fail("received %d B from rank %d (tag %d), want %zu", count, from, tag, len);
}

static void pingpong(int iters, int allow_local)
{
	char peer[MPI_MAX_PROCESSOR_NAME];
	int other = rank == 0 ? 1 : 0;
	uint8_t *sbuf, *rbuf;
	double t1m = 0;

	/* The peer's host name, for the output and the different-host check. */
	memset(peer, 0, sizeof(peer));
	MPI_Sendrecv(host, sizeof(host), MPI_CHAR, other, TAG_PING,
		     peer, sizeof(peer), MPI_CHAR, other, TAG_PING,
		     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	peer[sizeof(peer) - 1] = '\0';
	if (!allow_local && strcmp(peer, host) == 0)
		fail("ranks 0 and 1 both run on %s (want different hosts; -l allows it)", host);

	sbuf = malloc(MAX_SIZE + 1);
	rbuf = malloc(MAX_SIZE + 1);
	if (!sbuf || !rbuf)
		fail("out of memory");

	for (size_t s = 0; s < NSIZES; s++) {
		size_t len = sizes[s];
		double t0 = MPI_Wtime();

		for (int it = 0; it < iters; it++) {
			/* A stale byte from the previous round must not pass. */
			memset(rbuf, 0xa5, len + 1);
			if (rank == 0) {
				fill(sbuf, len, it, 0);
				MPI_Send(sbuf, (int)len, MPI_BYTE, 1, TAG_PING, MPI_COMM_WORLD);
				recv_exact(rbuf, len, 1, TAG_PONG);
				check(rbuf, len, it, 1, 1);
			} else {
				recv_exact(rbuf, len, 0, TAG_PING);
				check(rbuf, len, it, 0, 0);
				fill(sbuf, len, it, 1);
				MPI_Send(sbuf, (int)len, MPI_BYTE, 0, TAG_PONG, MPI_COMM_WORLD);
			}
		}
		if (len == MAX_SIZE)
			t1m = (MPI_Wtime() - t0) / iters * 1e6;
	}
	free(sbuf);
	free(rbuf);
	printf("vrdma-mpi-check: rank %d on %s: pingpong with rank %d on %s: %zu sizes %zu..%u B x %d verified (%.0f us per 1 MiB round trip)\n",
	       rank, host, other, peer, NSIZES, sizes[0], MAX_SIZE, iters, t1m);
	fflush(stdout);
}

static void allreduce(int nranks)
{
	static int64_t in[REDUCE_LEN], out[REDUCE_LEN];
	/* sum over r of (r * 1000003 + i) = n(n-1)/2 * 1000003 + n * i */
	int64_t base = (int64_t)nranks * (nranks - 1) / 2 * 1000003;
	int maxrank = -1;

	for (int i = 0; i < REDUCE_LEN; i++) {
		in[i] = (int64_t)rank * 1000003 + i;
		out[i] = -1;
	}
	MPI_Allreduce(in, out, REDUCE_LEN, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
	for (int i = 0; i < REDUCE_LEN; i++) {
		int64_t want = base + (int64_t)nranks * i;

		if (out[i] != want)
			fail("allreduce sum element %d is %lld, want %lld", i,
			     (long long)out[i], (long long)want);
	}
	MPI_Allreduce(&rank, &maxrank, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (maxrank != nranks - 1)
		fail("allreduce max of the ranks is %d, want %d", maxrank, nranks - 1);
	printf("vrdma-mpi-check: rank %d on %s: allreduce of %d ranks verified\n", rank, host, nranks);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int nranks, len, opt, iters = 8, allow_local = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Get_processor_name(host, &len);

	while ((opt = getopt(argc, argv, "n:l")) != -1) {
		switch (opt) {
		case 'n':
			iters = atoi(optarg);
			if (iters < 1 || iters > MAX_ITERS)
				fail("-n %s: want 1..%d", optarg, MAX_ITERS);
			break;
		case 'l':
			allow_local = 1;
			break;
		default:
			fail("usage: vrdma-mpi-check [-n ITERS] [-l]");
		}
	}
	if (nranks < 2)
		fail("%d rank(s); the ping-pong needs at least 2", nranks);

	if (rank < 2)
		pingpong(iters, allow_local);
	allreduce(nranks);
	MPI_Finalize();
	return 0;
}
