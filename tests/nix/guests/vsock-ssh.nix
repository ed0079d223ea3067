# A guest reached with `ssh vsock/<cid>` from the host: microvm.nix's
# vsock.ssh.enable (its sshd listens on vsock port 22), on QEMU, the
# hypervisor microvm.nix's examples use; nothing else set.
{
  networking.hostName = "shell";
  microvm.vsock = {
    cid = 42;
    ssh.enable = true;
  };
}
