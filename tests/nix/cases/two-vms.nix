# A valid host with two VMs: every option used at least once.
{pkgs, ...}: {
  vmwarden = {
    enable = true;
    package = pkgs.vmwarden;
    vms.web = {
      vcpus = 2;
      memoryMiB = 1024;
      kernel = "${pkgs.linux}/bzImage";
      initrd = "/var/lib/vmwarden-images/web/initrd";
      cmdline = "console=ttyS0 quiet";
      disks = [
        {path = "/var/lib/vmwarden/web/root.img";}
        {
          path = "/srv/images/shared.img";
          readOnly = true;
        }
      ];
      credentials = {
        db-password = "/run/secrets/db-password";
        api-token = "/run/agenix/api-token";
      };
      interfaces = [
        {
          tap = "vmw-web0";
          bridge = "br0";
          mac = "02:00:00:00:00:01";
        }
        {tap = "vmw-web1";}
      ];
      principal.uid = 30001;
      keepOnPurge = ["identity" "ssh-host-keys"];
    };
    vms.batch = {
      accel = "tcg";
      machine = "pc";
      kernel = "/srv/images/vmlinuz";
      disks = [{path = "/srv/images/batch.img";}];
      landlock = {
        mode = "best-effort";
        read = ["/srv/datasets"];
        write = ["/srv/scratch/batch"];
      };
      autostart = false;
      restartIfChanged = false;
    };
  };
}
