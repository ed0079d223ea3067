/* api-running SOCKET URI TIMEOUT_S -- CMD [ARG...]
 *
 * The bench of the cloud_hypervisor and firecracker scenarios (in L2):
 * starts CMD (not waited for: a hypervisor keeps running; `systemctl start
 * --no-block` returns at once) and polls the HTTP API on the unix socket
 * SOCKET with `GET URI` until the JSON body says "state":"Running"
 * (cloud-hypervisor's /api/v1/vm.info, firecracker's /). Prints
 * `API-RUNNING ms=<start to running, milliseconds> t0=<start> t1=<running>
 * pid=<CMD's pid>` (t0, t1: CLOCK_MONOTONIC in seconds, the journal's
 * monotonic clock) and exits 0, or exits 1 after TIMEOUT_S seconds. Built static on the host by
 * run.sh (L2 has no compiler).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* One request; 1 when the response body says the VM is running. */
static int running(const char *sock, const char *uri) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  struct timeval tv = {.tv_sec = 2};
  char req[512], buf[65536];
  size_t n = 0;
  ssize_t r;
  int fd, ok;
  if (strlen(sock) >= sizeof a.sun_path) return 0;
  strcpy(a.sun_path, sock);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return 0; }
  snprintf(req, sizeof req,
           "GET %s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n", uri);
  if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) { close(fd); return 0; }
  /* Read until the body holds the state or the peer stops sending. */
  while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) {
    n += (size_t)r;
    buf[n] = 0;
    if (strstr(buf, "\"state\":")) {
      char *b = strstr(buf, "\r\n\r\n");
      if (b && strchr(b, '}')) break;
    }
  }
  buf[n] = 0;
  ok = strstr(buf, "\"state\":\"Running\"") != NULL;
  close(fd);
  return ok;
}

int main(int argc, char **argv) {
  double t0, limit;
  pid_t pid;
  struct timespec ms = {.tv_nsec = 1000000};
  if (argc < 6 || strcmp(argv[4], "--") != 0) {
    fprintf(stderr, "usage: api-running SOCKET URI TIMEOUT_S -- CMD [ARG...]\n");
    return 2;
  }
  limit = atof(argv[3]);
  t0 = now();
  pid = fork();
  if (pid < 0) { perror("fork"); return 1; }
  if (pid == 0) {
    execv(argv[5], argv + 5);
    perror(argv[5]);
    _exit(127);
  }
  while (now() - t0 < limit) {
    if (running(argv[1], argv[2])) {
      double t1 = now();
      printf("API-RUNNING ms=%.1f t0=%.6f t1=%.6f pid=%d\n", (t1 - t0) * 1e3, t0, t1, (int)pid);
      return 0;
    }
    waitpid(-1, NULL, WNOHANG); /* reap a CMD that returned (systemctl) */
    nanosleep(&ms, NULL);
  }
  fprintf(stderr, "api-running: %s did not say Running within %s s\n", argv[1], argv[3]);
  return 1;
}
