# The host's own tools: a QEMU guest registered with systemd-machined,
# with a balloon (initial size and deflate-on-OOM as microvm.nix sets
# them); the host turns its console on.
{
  networking.hostName = "tools";
  microvm = {
    hypervisor = "qemu";
    mem = 1024;
    balloon = true;
    initialBalloonMem = 256;
    deflateOnOOM = false;
    registerWithMachined = true;
  };
}
