# The shares, disks and vsock fields set directly: shares, disk format/serial/create, vsock
# with each backend, extraArgs; QEMU and cloud-hypervisor.
{pkgs, ...}: {
  vmwarden = {
    enable = true;
    package = pkgs.vmwarden;
    vms.web = {
      kernel = "/srv/images/vmlinuz";
      shares = [
        {
          tag = "ro-store";
          source = "/nix/store";
          readOnly = true;
        }
        {
          tag = "data";
          source = "/var/lib/vmwarden/web/data";
          proto = "9p";
        }
        {
          tag = "media";
          source = "/srv/media";
        }
      ];
      disks = [
        {
          path = "/var/lib/vmwarden/web/var.img";
          serial = "var";
          create.sizeMiB = 1024;
        }
        {
          path = "/var/lib/vmwarden/web/raw.img";
          create = {
            sizeMiB = 16;
            fsType = null;
          };
        }
        {
          path = "/srv/images/base.qcow2";
          format = "qcow2";
          readOnly = true;
        }
      ];
      vsock.cid = 3;
      extraArgs = [
        "-device"
        "virtio-rng-device"
        "-qmp"
        "unix:/run/vmwarden/web/control/extra-qmp.sock,server=on,wait=off"
        "-fw_cfg"
        "name=opt/org.example/role,string=web"
      ];
    };
    vms.ssh = {
      kernel = "/srv/images/vmlinuz";
      machine = "q35";
      vsock = {
        cid = 4;
        backend = "vhost";
      };
    };
    vms.api = {
      hypervisor = "cloud-hypervisor";
      kernel = "/srv/images/vmlinux";
      shares = [
        {
          tag = "ro-store";
          source = "/nix/store";
          readOnly = true;
        }
      ];
      vsock.cid = 5;
      extraArgs = ["--rng" "src=/dev/urandom"];
    };
  };
}
