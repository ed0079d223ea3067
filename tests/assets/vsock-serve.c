/* vsock-serve PORT PROGRAM [ARG...]: an inetd for one vsock port, in the
 * shares guest (the vsock-ssh tests: `dropbear -i` behind port 22).
 *
 * Listens on vsock PORT (any CID) and, for every connection, runs PROGRAM
 * with a socket as its stdin and stdout (stderr stays the console's), as
 * inetd does for a server in inetd mode. PROGRAM gets one end of a Unix
 * socket pair, and a relay process copies bytes between the other end and
 * the vsock connection: dropbear looks its peer's address up with
 * getnameinfo(3), which knows no AF_VSOCK and makes it exit, while a Unix
 * socket's peer it can name. Runs until killed; finished children are
 * reaped by the kernel (SIGCHLD ignored). Markers on stdout (the console):
 *   VSOCK-SERVE listening port=<port>
 *   VSOCK-SERVE-ERROR <what>: <errno text>
 * Built static by build-guest-shares.sh (busybox has no vsock applet). */
#include <errno.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Copy what `from` has to `to`; on end of file, end `to`'s writing side.
 * Returns 0 once `from` is done, 1 while it may have more. */
static int pump(int from, int to) {
  char buf[16384];
  ssize_t n = read(from, buf, sizeof buf);
  if (n <= 0) {
    shutdown(to, SHUT_WR);
    return 0;
  }
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(to, buf + off, (size_t)(n - off));
    if (w <= 0) return 0;
    off += w;
  }
  return 1;
}

/* One connection: PROGRAM on one end of a socket pair, this process
 * relaying between the other end and the vsock connection `c`. */
static void serve(int c, char **argv) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) {
    dprintf(2, "VSOCK-SERVE-ERROR socketpair: %s\n", strerror(errno));
    _exit(1);
  }
  signal(SIGCHLD, SIG_DFL);
  pid_t p = fork();
  if (p == 0) {
    if (dup2(sv[1], 0) < 0 || dup2(sv[1], 1) < 0) _exit(127);
    close(sv[0]);
    close(sv[1]);
    close(c);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv);
    dprintf(2, "VSOCK-SERVE-ERROR exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(sv[1]);
  if (p < 0) _exit(1);
  struct pollfd fds[2] = {{.fd = c, .events = POLLIN}, {.fd = sv[0], .events = POLLIN}};
  int open_in = 1, open_out = 1;
  /* Until PROGRAM has said all it will: its end is the session's end (the
   * peer of a hybrid vsock may never pass on an end of its own). */
  while (open_out) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (open_in && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      open_in = pump(c, sv[0]);
      if (!open_in) fds[0].fd = -1;
    }
    if (open_out && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      open_out = pump(sv[0], c);
      if (!open_out) fds[1].fd = -1;
    }
  }
  waitpid(p, NULL, 0);
  _exit(0);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: vsock-serve PORT PROGRAM [ARG...]\n");
    return 2;
  }
  signal(SIGCHLD, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  int s = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_vm a;
  memset(&a, 0, sizeof a);
  a.svm_family = AF_VSOCK;
  a.svm_cid = VMADDR_CID_ANY;
  a.svm_port = (unsigned int)atoi(argv[1]);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 8) < 0) {
    printf("VSOCK-SERVE-ERROR listen: %s\n", strerror(errno));
    return 1;
  }
  printf("VSOCK-SERVE listening port=%s\n", argv[1]);
  fflush(stdout);
  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c < 0) {
      if (errno == EINTR) continue;
      printf("VSOCK-SERVE-ERROR accept: %s\n", strerror(errno));
      return 1;
    }
    pid_t p = fork();
    if (p == 0) {
      close(s);
      serve(c, argv + 2);
    }
    if (p < 0) printf("VSOCK-SERVE-ERROR fork: %s\n", strerror(errno));
    close(c);
  }
}
