/* vmm-notify VERB: what systemd-shutdown (systemd 256 and later) tells its
 * VMM just before the guest ends, for the shares guest, whose PID 1 is a
 * shell and not systemd (the guest_reboot scenario).
 *
 * systemd's PID 1 takes its notify address from the credential
 * vmm.notify_socket; a firecracker VM with vsock gets it on the kernel
 * command line as systemd.set_credential=vmm.notify_socket:vsock-stream:2:PORT.
 * This reads that word from /proc/cmdline, connects to the host (CID 2) on
 * vsock PORT, writes the bytes systemd-shutdown writes,
 *   EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=VERB   (no newline at the end)
 * and closes. Markers on stdout (the console):
 *   VMM-NOTIFY sent=<VERB> port=<PORT>
 *   VMM-NOTIFY none            no such credential: nothing to tell
 *   VMM-NOTIFY-ERROR <what>    (exit 1)
 * An alarm ends it after 5 s, so an init's last step never waits longer.
 * Built static by build-guest-shares.sh (busybox has no vsock applet). */
#include <errno.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char KEY[] = "systemd.set_credential=vmm.notify_socket:vsock-stream:2:";

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: vmm-notify VERB\n");
    return 2;
  }
  alarm(5);
  char cmdline[8192];
  int f = open("/proc/cmdline", O_RDONLY);
  ssize_t n = f < 0 ? -1 : read(f, cmdline, sizeof cmdline - 1);
  if (n < 0) {
    printf("VMM-NOTIFY-ERROR /proc/cmdline: %s\n", strerror(errno));
    return 1;
  }
  cmdline[n] = 0;
  unsigned long port = 0;
  for (char *w = strtok(cmdline, " \n"); w; w = strtok(NULL, " \n")) {
    if (strncmp(w, KEY, sizeof KEY - 1) == 0) port = strtoul(w + sizeof KEY - 1, NULL, 10);
  }
  if (port == 0) {
    printf("VMM-NOTIFY none\n");
    return 0;
  }
  int s = socket(AF_VSOCK, SOCK_STREAM, 0);
  struct sockaddr_vm a;
  memset(&a, 0, sizeof a);
  a.svm_family = AF_VSOCK;
  a.svm_cid = VMADDR_CID_HOST;
  a.svm_port = (unsigned int)port;
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
    printf("VMM-NOTIFY-ERROR connect port=%lu: %s\n", port, strerror(errno));
    return 1;
  }
  char msg[128];
  int len = snprintf(msg, sizeof msg, "EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=%s", argv[1]);
  if (len < 0 || len >= (int)sizeof msg || write(s, msg, (size_t)len) != len) {
    printf("VMM-NOTIFY-ERROR write port=%lu: %s\n", port, strerror(errno));
    return 1;
  }
  close(s);
  printf("VMM-NOTIFY sent=%s port=%lu\n", argv[1], port);
  return 0;
}
