/* vsock-echo PORT: the shares guest's vsock endpoint (the shares tests).
 *
 * Prints this guest's CID (from /dev/vsock), listens on vsock PORT, accepts
 * one connection, reads one line and answers "guest-got:<line>\n", then
 * exits. Markers on stdout (the console):
 *   VSOCK-ECHO cid=<n>
 *   VSOCK-ECHO listening port=<port>
 *   VSOCK-ECHO got=<line>
 * Built static by build-guest-shares.sh (busybox has no vsock applet). */
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: vsock-echo PORT\n");
    return 2;
  }
  unsigned int cid = 0;
  int dev = open("/dev/vsock", O_RDONLY);
  if (dev < 0 || ioctl(dev, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid) < 0) {
    perror("VSOCK-ECHO-ERROR /dev/vsock");
    return 1;
  }
  printf("VSOCK-ECHO cid=%u\n", cid);
  fflush(stdout);
  int s = socket(AF_VSOCK, SOCK_STREAM, 0);
  struct sockaddr_vm a;
  memset(&a, 0, sizeof a);
  a.svm_family = AF_VSOCK;
  a.svm_cid = VMADDR_CID_ANY;
  a.svm_port = (unsigned int)atoi(argv[1]);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 1) < 0) {
    perror("VSOCK-ECHO-ERROR listen");
    return 1;
  }
  printf("VSOCK-ECHO listening port=%s\n", argv[1]);
  fflush(stdout);
  int c = accept(s, NULL, NULL);
  if (c < 0) {
    perror("VSOCK-ECHO-ERROR accept");
    return 1;
  }
  char buf[256];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t r = read(c, buf + n, 1);
    if (r <= 0 || buf[n] == '\n') break;
    n++;
  }
  buf[n] = 0;
  printf("VSOCK-ECHO got=%s\n", buf);
  fflush(stdout);
  dprintf(c, "guest-got:%s\n", buf);
  close(c);
  return 0;
}
