/* udp-ceiling: what raw UDP does between two processes on one host, the
 * ceiling rxe-emu's figures are compared with (conformance-tests/run --bench).
 *
 *   udp-ceiling stream  ADDR SIZE SECONDS   sendmmsg/recvmmsg, 64 datagrams a call
 *   udp-ceiling gso     ADDR SIZE SECONDS   UDP_SEGMENT sends (as many SIZE segments
 *                                           as fit 64 KiB), UDP_GRO receiver
 *   udp-ceiling pingpong ADDR SIZE ITERS spin|block
 *                                           one datagram each way; half round trips
 *
 * Both processes use ADDR (ports 47910 and 47911). Output, one line:
 *   stream/gso: "MB/s <receiver's MB/s> cpu_s_per_GiB <both processes' CPU>"
 *   pingpong:   "half_rtt_us typical <median> avg <mean> p99 <p99> p999 <p99.9>"
 *   "n/a <why>" when the kernel refuses (GSO without checksum offload: EIO).
 * Exit status 0 on a figure or n/a, 1 on a usage or setup error. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define PORT_A 47910
#define PORT_B 47911
#define BATCH 64

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
  fprintf(stderr, "udp-ceiling: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int sock_at(const char *addr, int port, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(port);
  if (inet_pton(AF_INET, addr, &sa->sin_addr) != 1) {
    fprintf(stderr, "udp-ceiling: %s is not an IPv4 address\n", addr);
    exit(1);
  }
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  if (s < 0) die("socket");
  int big = 8 << 20;
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (bind(s, (struct sockaddr *)sa, sizeof *sa) < 0) die("bind");
  return s;
}

/* CPU seconds of the waited-for children. */
static double children_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

/* stream and gso: a receiver child counts bytes for SECONDS and writes the
 * count to a pipe; the sender child sends until killed. */
static int throughput(const char *addr, int size, double secs, int gso) {
  int pfd[2];
  if (pipe(pfd) < 0) die("pipe");
  struct sockaddr_in sa_r, sa_s;
  int r = sock_at(addr, PORT_B, &sa_r);
  if (gso) {
    int on = 1;
    if (setsockopt(r, IPPROTO_UDP, UDP_GRO, &on, sizeof on) < 0) {
      printf("n/a UDP_GRO: %s\n", strerror(errno));
      return 0;
    }
  }
  int seg = gso ? (65000 / size) : 1; /* datagrams per send */
  if (seg > 64) seg = 64;
  pid_t rx = fork();
  if (rx == 0) {
    close(pfd[0]);
    static char buf[BATCH][65536];
    struct mmsghdr m[BATCH];
    struct iovec iov[BATCH];
    for (int i = 0; i < BATCH; i++) {
      iov[i].iov_base = buf[i];
      iov[i].iov_len = sizeof buf[i];
      memset(&m[i], 0, sizeof m[i]);
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
    }
    struct timeval tv = {0, 200000};
    setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint64_t bytes = 0;
    double t0 = 0, end = 0;
    for (;;) {
      int n = recvmmsg(r, m, BATCH, MSG_WAITFORONE, NULL);
      double t = now_s();
      if (n > 0 && t0 == 0) {
        t0 = t; /* the clock starts at the first datagram */
        end = t0 + secs;
        continue;
      }
      if (t0 != 0 && t >= end) break;
      if (n < 0 && t0 == 0 && errno == EAGAIN) continue;
      for (int i = 0; i < n; i++) bytes += m[i].msg_len;
    }
    double mbs = bytes / secs / 1e6;
    if (write(pfd[1], &mbs, sizeof mbs) != sizeof mbs) _exit(1);
    _exit(0);
  }
  close(r);
  pid_t tx = fork();
  if (tx == 0) {
    int s = sock_at(addr, PORT_A, &sa_s);
    static char buf[BATCH][65536];
    struct mmsghdr m[BATCH];
    struct iovec iov[BATCH];
    char cbuf[BATCH][CMSG_SPACE(sizeof(uint16_t))];
    for (int i = 0; i < BATCH; i++) {
      memset(buf[i], 0x5a, sizeof buf[i]);
      iov[i].iov_base = buf[i];
      iov[i].iov_len = (size_t)size * seg;
      memset(&m[i], 0, sizeof m[i]);
      m[i].msg_hdr.msg_name = &sa_r;
      m[i].msg_hdr.msg_namelen = sizeof sa_r;
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      if (gso) {
        m[i].msg_hdr.msg_control = cbuf[i];
        m[i].msg_hdr.msg_controllen = sizeof cbuf[i];
        struct cmsghdr *c = CMSG_FIRSTHDR(&m[i].msg_hdr);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t g = size;
        memcpy(CMSG_DATA(c), &g, sizeof g);
      }
    }
    int calls = gso ? 4 : BATCH; /* GSO: 4 sends of up to 64 KiB per call */
    for (;;) {
      int n = sendmmsg(s, m, calls, 0);
      if (n < 0 && errno == EIO) _exit(3); /* GSO refused by the device */
      if (n < 0 && errno != ENOBUFS && errno != EAGAIN && errno != ECONNREFUSED) _exit(2);
    }
  }
  close(pfd[1]);
  double mbs = 0;
  ssize_t got = read(pfd[0], &mbs, sizeof mbs);
  kill(tx, SIGKILL);
  int st = 0;
  waitpid(rx, NULL, 0);
  waitpid(tx, &st, 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
    printf("n/a UDP_SEGMENT: EIO (no checksum offload on this device)\n");
    return 0;
  }
  if (got != sizeof mbs) {
    fprintf(stderr, "udp-ceiling: the receiver failed\n");
    return 1;
  }
  double cpu = children_cpu();
  double gib = mbs * 1e6 * secs / (double)(1u << 30);
  printf("MB/s %.1f cpu_s_per_GiB %.2f\n", mbs, gib > 0 ? cpu / gib : 0);
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* pingpong: the parent sends, the child echoes; SIZE bytes each way. */
static int pingpong(const char *addr, int size, int iters, int spin) {
  struct sockaddr_in sa_a, sa_b;
  int a = sock_at(addr, PORT_A, &sa_a);
  int b = sock_at(addr, PORT_B, &sa_b);
  int flags = spin ? MSG_DONTWAIT : 0;
  char buf[65536];
  memset(buf, 0x5a, sizeof buf);
  pid_t echo = fork();
  if (echo == 0) {
    close(a);
    for (int i = 0; i < iters + 100; i++) {
      ssize_t n;
      while ((n = recv(b, buf, sizeof buf, flags)) < 0)
        if (errno != EAGAIN && errno != EINTR) _exit(1);
      if (sendto(b, buf, n, 0, (struct sockaddr *)&sa_a, sizeof sa_a) < 0) _exit(1);
    }
    _exit(0);
  }
  close(b);
  double *rtt = calloc(iters, sizeof *rtt);
  if (!rtt) die("calloc");
  for (int i = 0; i < iters + 100; i++) {
    double t0 = now_s();
    if (sendto(a, buf, size, 0, (struct sockaddr *)&sa_b, sizeof sa_b) < 0) die("sendto");
    while (recv(a, buf, sizeof buf, flags) < 0)
      if (errno != EAGAIN && errno != EINTR) die("recv");
    if (i >= 100) rtt[i - 100] = (now_s() - t0) / 2 * 1e6; /* 100 warm-up rounds */
  }
  waitpid(echo, NULL, 0);
  double sum = 0;
  for (int i = 0; i < iters; i++) sum += rtt[i];
  qsort(rtt, iters, sizeof *rtt, cmp);
  printf("half_rtt_us typical %.2f avg %.2f p99 %.2f p999 %.2f\n", rtt[iters / 2], sum / iters,
         rtt[(int)(iters * 0.99)], rtt[(int)(iters * 0.999)]);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr,
            "usage: udp-ceiling stream|gso ADDR SIZE SECONDS\n"
            "       udp-ceiling pingpong ADDR SIZE ITERS spin|block\n");
    return 1;
  }
  int size = atoi(argv[3]);
  if (size < 1 || size > 65000) {
    fprintf(stderr, "udp-ceiling: SIZE must be 1..65000\n");
    return 1;
  }
  if (!strcmp(argv[1], "stream")) return throughput(argv[2], size, atof(argv[4]), 0);
  if (!strcmp(argv[1], "gso")) return throughput(argv[2], size, atof(argv[4]), 1);
  if (!strcmp(argv[1], "pingpong") && argc >= 6) {
    int iters = atoi(argv[4]);
    if (iters < 10) iters = 10;
    return pingpong(argv[2], size, iters, !strcmp(argv[5], "spin"));
  }
  fprintf(stderr, "udp-ceiling: unknown mode %s\n", argv[1]);
  return 1;
}
