# The usual microvm.nix guest: QEMU, the host's /nix/store shared over
# virtiofs (as microvm.nix's docs write it: without readOnly), a writable
# share with a relative source, two vCPUs.
{
  networking.hostName = "web";
  boot.kernelParams = ["quiet"];
  microvm = {
    vcpu = 2;
    mem = 1024;
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
        proto = "virtiofs";
      }
      {
        tag = "home";
        source = "home";
        mountPoint = "/home";
        proto = "virtiofs";
      }
    ];
  };
}
