/* The scale bench's scan floor: the least kernel work the whole-host
 * credential-mount proof needs, with next to no user-space work around
 * it. Every mount namespace of the host is enumerated (NS_MNT_GET_PREV
 * and NS_MNT_GET_NEXT from the caller's own, Linux 6.12), each one's
 * mounts listed (listmount: from its first mount, climbing through the
 * parents to the topmost, then everything under it), each mount's
 * superblock magic stated (statmount STATMOUNT_SB_BASIC: no string) and
 * a tmpfs's source (STATMOUNT_SB_SOURCE): what
 * launcher/src/host/ns_mounts.rs asks of the kernel, nothing more.
 *
 *   scan-floor [ROUNDS [SINCE]]
 *                         prints the median microseconds of one scan
 *                         (its CPU time: the work, not a loaded
 *                         machine's waits),
 *                         then the namespaces and mounts it saw.
 *                         SINCE: list only mounts whose unique id is at
 *                         or above it (listmount from SINCE - 1, the
 *                         topmost mount stated only when it is), what
 *                         cleanup and verify-clean of a VM ask from its
 *                         credential floor (instance/creds_floor.rs)
 *
 * Run as root (CAP_SYS_ADMIN: every namespace). Exits 1 when the kernel
 * cannot answer. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct mnt_ns_info { uint32_t size, nr_mounts; uint64_t mnt_ns_id; };
struct mnt_id_req { uint32_t size, spare; uint64_t mnt_id, param, mnt_ns_id; };
#define NS_GET_MNTNS_ID _IOR(0xb7, 5, uint64_t)
#define NS_MNT_GET_NEXT _IOR(0xb7, 11, struct mnt_ns_info)
#define NS_MNT_GET_PREV _IOR(0xb7, 12, struct mnt_ns_info)
#define LSMT_ROOT 0xffffffffffffffffULL
#define STATMOUNT_MNT_BASIC 0x2
#define STATMOUNT_SB_SOURCE 0x200
#define STATMOUNT_SB_BASIC 0x1
#define TMPFS_MAGIC 0x01021994
#define RAMFS_MAGIC 0x858458f6
#define BATCH 64

static long nmounts;
static uint64_t since;

static long list(uint64_t ns, uint64_t parent, uint64_t last, uint64_t *ids) {
	struct mnt_id_req r = { sizeof r, 0, parent, last, ns };
	return syscall(458, &r, ids, BATCH, 0);
}

static int stat_mount(uint64_t ns, uint64_t id, uint64_t mask, uint64_t *buf, size_t len) {
	struct mnt_id_req r = { sizeof r, 0, id, mask, ns };
	return syscall(457, &r, buf, len, 0);
}

/* One mount: its magic, and a tmpfs's source. */
static int check(uint64_t ns, uint64_t id, uint64_t *buf, size_t len) {
	nmounts++;
	if (stat_mount(ns, id, STATMOUNT_SB_BASIC, buf, 512))
		return -1;
	if (buf[24 / 8] != TMPFS_MAGIC && buf[24 / 8] != RAMFS_MAGIC)
		return 0;
	return stat_mount(ns, id, STATMOUNT_SB_SOURCE, buf, len);
}

static int scan_ns(uint64_t ns) {
	uint64_t ids[BATCH], buf[(512 + 256) / 8], top, last = 0;
	long n = list(ns, LSMT_ROOT, 0, ids);
	if (n <= 0)
		return 0; /* emptied meanwhile */
	top = ids[0];
	for (int i = 0; i < 64; i++) {
		if (stat_mount(ns, top, STATMOUNT_MNT_BASIC, buf, 512))
			return -1;
		if (buf[48 / 8] == top)
			break;
		top = buf[48 / 8];
	}
	if (since)
		last = since - 1;
	if (top >= since && check(ns, top, buf, sizeof buf))
		return -1;
	do {
		n = list(ns, top, last, ids);
		if (n < 0)
			return -1;
		for (long i = 0; i < n; i++) {
			if (check(ns, ids[i], buf, sizeof buf))
				return -1;
		}
		if (n > 0)
			last = ids[n - 1];
	} while (n == BATCH);
	return 0;
}

static long scan(void) {
	int own = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC);
	uint64_t id;
	long count = 1;
	if (own < 0 || ioctl(own, NS_GET_MNTNS_ID, &id) || scan_ns(id))
		return -1;
	unsigned long steps[2] = { NS_MNT_GET_PREV, NS_MNT_GET_NEXT };
	for (int s = 0; s < 2; s++) {
		int cur = dup(own);
		for (;;) {
			struct mnt_ns_info info = { sizeof info, 0, 0 };
			int next = ioctl(cur, steps[s], &info);
			close(cur);
			if (next < 0)
				break;
			if (scan_ns(info.mnt_ns_id))
				return -1;
			count++;
			cur = next;
		}
	}
	close(own);
	return count;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	if (rounds < 1 || rounds > 1000)
		rounds = 5;
	since = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
	double us[1000];
	long namespaces = 0;
	for (int r = 0; r < rounds; r++) {
		struct timespec a, b;
		nmounts = 0;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
		namespaces = scan();
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
		if (namespaces < 0) {
			perror("scan-floor: the kernel cannot enumerate the mount namespaces");
			return 1;
		}
		us[r] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
	}
	qsort(us, rounds, sizeof us[0], cmp);
	printf("%.0f %ld %ld\n", us[rounds / 2], namespaces, nmounts);
	return 0;
}
