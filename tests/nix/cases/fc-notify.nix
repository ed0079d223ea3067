# The guest's notify socket (vsock.notify, vsock.notifyPort) set directly on
# firecracker VMs: on by default (nothing written: the launcher's default),
# on at another port, and off.
{pkgs, ...}: {
  vmwarden = {
    enable = true;
    package = pkgs.vmwarden;
    vms = {
      fcdef = {
        hypervisor = "firecracker";
        kernel = "/srv/images/vmlinux";
        vsock.cid = 21;
      };
      fcport = {
        hypervisor = "firecracker";
        kernel = "/srv/images/vmlinux";
        vsock = {
          cid = 22;
          notifyPort = 9999;
        };
      };
      fcoff = {
        hypervisor = "firecracker";
        kernel = "/srv/images/vmlinux";
        vsock = {
          cid = 23;
          notify = false;
        };
      };
    };
  };
}
