/* guest-io-tool: the workloads of tests/bench/guest-io.sh, and its host-side
 * TCP sink. Built static by the bench (the guest's busybox has no tool that
 * times a transfer to the nanosecond, and its nc stops short on a pipe).
 *
 *   guest-io-tool sink ADDR PORT          (host) accept connections one after
 *                                         the other, read each to its end,
 *                                         discard; forever
 *   guest-io-tool send ADDR PORT MIB      send MIB MiB, shut the write side,
 *                                         wait for the peer to close
 *   guest-io-tool read PATH MIB [direct]  read MIB MiB from PATH, 1 MiB at a time
 *   guest-io-tool write PATH MIB [direct] write MIB MiB to PATH, then fsync
 *
 * Each workload prints `bytes=<n> ns=<elapsed, CLOCK_MONOTONIC>` and exits 0;
 * anything else is an error on stderr and exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int die(const char *what) {
  fprintf(stderr, "guest-io-tool: %s: %s\n", what, strerror(errno));
  return 1;
}

static char *buffer(void) {
  void *b = NULL;
  if (posix_memalign(&b, 4096, CHUNK) != 0) return NULL;
  memset(b, 0x5a, CHUNK);
  return b;
}

static int addr_of(const char *ip, const char *port, struct sockaddr_in *a) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((unsigned short)atoi(port));
  return inet_pton(AF_INET, ip, &a->sin_addr) == 1 ? 0 : -1;
}

static int sink(const char *ip, const char *port) {
  struct sockaddr_in a;
  int one = 1, s;
  char *b = buffer();
  if (!b || addr_of(ip, port, &a) != 0) return die("sink address");
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return die("socket");
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) return die("bind");
  if (listen(s, 4) != 0) return die("listen");
  for (;;) {
    int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return die("accept");
    }
    while (read(c, b, CHUNK) > 0) {
    }
    close(c);
  }
}

static int report(long long bytes, long long t0) {
  printf("bytes=%lld ns=%lld\n", bytes, now_ns() - t0);
  return 0;
}

static int send_to(const char *ip, const char *port, long long mib) {
  struct sockaddr_in a;
  char *b = buffer();
  long long sent = 0, total = mib * CHUNK, t0;
  int s;
  if (!b || addr_of(ip, port, &a) != 0) return die("send address");
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return die("socket");
  t0 = now_ns();
  if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) return die("connect");
  while (sent < total) {
    ssize_t n = write(s, b, (size_t)(total - sent < CHUNK ? total - sent : CHUNK));
    if (n < 0) {
      if (errno == EINTR) continue;
      return die("write");
    }
    sent += n;
  }
  if (shutdown(s, SHUT_WR) != 0) return die("shutdown");
  while (read(s, b, CHUNK) > 0) {
  }
  return report(sent, t0);
}

static int file_io(int writing, const char *path, long long mib, int direct) {
  char *b = buffer();
  long long done = 0, t0;
  int fd, flags = (writing ? O_WRONLY | O_CREAT : O_RDONLY) | O_CLOEXEC | (direct ? O_DIRECT : 0);
  if (!b) return die("buffer");
  fd = open(path, flags, 0600);
  if (fd < 0) return die(path);
  t0 = now_ns();
  while (done < mib * CHUNK) {
    ssize_t n = writing ? write(fd, b, CHUNK) : read(fd, b, CHUNK);
    if (n < 0) {
      if (errno == EINTR) continue;
      return die(writing ? "write" : "read");
    }
    if (n == 0) break;
    done += n;
  }
  if (writing && fsync(fd) != 0) return die("fsync");
  return report(done, t0);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "sink")) return sink(argv[2], argv[3]);
  if (argc == 5 && !strcmp(argv[1], "send")) return send_to(argv[2], argv[3], atoll(argv[4]));
  if ((argc == 4 || argc == 5) && (!strcmp(argv[1], "read") || !strcmp(argv[1], "write")))
    return file_io(argv[1][0] == 'w', argv[2], atoll(argv[3]), argc == 5 && !strcmp(argv[4], "direct"));
  fprintf(stderr,
          "usage: guest-io-tool sink ADDR PORT | send ADDR PORT MIB | read PATH MIB [direct] | write PATH MIB [direct]\n");
  return 2;
}
