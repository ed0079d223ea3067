/* The scale bench's process-walk floor: the least kernel work the
 * whole-host "no process of this uid is left" proof needs, with next to
 * no user-space work around it. /proc is read (getdents) and every
 * process entry's owner stated (fstatat on the open /proc: the entry's
 * uid, the first thing launcher/src/host/procs.rs asks of each process,
 * and all it asks of one that another uid owns): what a walk pays per
 * process before it knows whether the process can be the VM's. The
 * walk's other calls (a root-owned process's credentials, a kernel
 * thread's test) come on top and do not grow with the VMs, whose
 * processes are their principals'.
 *
 *   proc-floor [ROUNDS]   prints the median microseconds of one walk
 *                         (its CPU time: the work, not a loaded
 *                         machine's waits), then the processes it saw.
 *
 * Exits 1 when /proc cannot be read. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long walk(void) {
	DIR *d = opendir("/proc");
	long n = 0;
	if (!d)
		return -1;
	int fd = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		struct stat st;
		/* A process gone since the listing is no error. */
		if (fstatat(fd, e->d_name, &st, 0) == 0)
			n++;
	}
	closedir(d);
	return n;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	if (rounds < 1 || rounds > 1000)
		rounds = 5;
	double us[1000];
	long procs = 0;
	for (int r = 0; r < rounds; r++) {
		struct timespec a, b;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
		procs = walk();
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
		if (procs < 0) {
			perror("proc-floor: /proc");
			return 1;
		}
		us[r] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
	}
	qsort(us, rounds, sizeof us[0], cmp);
	printf("%.0f %ld\n", us[rounds / 2], procs);
	return 0;
}
