/* Host load beside the soak (tests/soak.sh): CPU and /proc churn.
 *
 *   soak-load RATE SECONDS PARENT
 *
 * Forks RATE short-lived processes a second (each appears in /proc and
 * exits at once; the parent reaps them) and burns CPU in one child at nice
 * 19. Bounded: never more than 64 children alive, and it stops by itself
 * after SECONDS, when PARENT is gone, or on SIGTERM. Prints
 * "load: N processes in T s (X/s)" when it stops. Compiled by soak.sh. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: soak-load RATE SECONDS PARENT\n");
    return 2;
  }
  long rate = atol(argv[1]);
  double seconds = atof(argv[2]);
  pid_t parent = (pid_t)atol(argv[3]);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  double t0 = now(), deadline = t0 + seconds;
  pid_t burner = fork();
  if (burner == 0) {
    if (nice(19) == -1 && errno != 0) _exit(1);
    volatile unsigned long x = 0;
    while (now() < deadline && getppid() != 1)
      for (int i = 0; i < 1000000; i++) x = x * 31 + 7;
    _exit(0);
  }
  long made = 0, alive = 0;
  while (!stop && now() < deadline && (parent <= 1 || kill(parent, 0) == 0)) {
    long want = (long)((now() - t0) * (double)rate) - made;
    if (want > 500) want = 500;
    for (long i = 0; i < want; i++) {
      while (alive >= 64) {
        pid_t p = waitpid(-1, NULL, 0);
        if (p == burner) burner = 0; else if (p > 0) alive--; else break;
      }
      pid_t c = fork();
      if (c == 0) _exit(0);
      if (c > 0) { alive++; made++; }
    }
    for (;;) {
      pid_t p = waitpid(-1, NULL, WNOHANG);
      if (p <= 0) break;
      if (p == burner) burner = 0; else alive--;
    }
    usleep(5000);
  }
  if (burner > 0) kill(burner, SIGKILL);
  while (waitpid(-1, NULL, 0) > 0) {}
  double t = now() - t0;
  printf("load: %ld processes in %.0f s (%.0f/s)\n", made, t, (double)made / (t > 0.001 ? t : 0.001));
  return 0;
}
