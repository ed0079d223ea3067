# The tiny guest the nixosTests boot inside the test VM: the nixpkgs kernel
# and an initrd with static busybox and kmod. Its /init prints
#   VMWARDEN-CRED name=<N> sha256=<hex>   per fw_cfg credential
#   VMWARDEN-GUEST-READY
# on the serial console (the unit's journal), and powers off on the ACPI
# power button (`vmwarden stop`) after printing VMWARDEN-GUEST-POWERBUTTON.
# Same markers as tests/assets/build-guest.sh, so logs read the same.
{pkgs}: let
  kernelPackage = pkgs.linuxPackages_6_12.kernel;
  modules = pkgs.makeModulesClosure {
    kernel = kernelPackage;
    firmware = kernelPackage;
    # Some are built in on NixOS kernels; then there is nothing to load.
    rootModules = ["qemu_fw_cfg" "virtio_pci" "virtio_mmio" "virtio_blk" "button" "evdev"];
    allowMissing = true;
  };
  busybox = "${pkgs.pkgsStatic.busybox}/bin/busybox";
  powerButton = pkgs.writeScript "PWRF-00000080" ''
    #!/bin/busybox sh
    echo VMWARDEN-GUEST-POWERBUTTON >/dev/console
    /bin/busybox poweroff -f
  '';
  init = pkgs.writeScript "init" ''
    #!/bin/busybox sh
    /bin/busybox mount -t devtmpfs devtmpfs /dev
    exec </dev/console >/dev/console 2>&1
    /bin/busybox --install -s /bin
    export PATH=/bin
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    for m in qemu_fw_cfg virtio_pci virtio_mmio virtio_blk button evdev; do
      modprobe "$m" 2>/dev/null || true
    done
    n=0
    for d in /sys/firmware/qemu_fw_cfg/by_name/opt/io.systemd.credentials/*; do
      [ -f "$d/raw" ] || continue
      sum=$(sha256sum <"$d/raw")
      echo "VMWARDEN-CRED name=''${d##*/} sha256=''${sum%% *}"
      n=$((n + 1))
    done
    [ "$n" -gt 0 ] || echo VMWARDEN-CRED-NONE
    acpid -f -c /etc/acpi -l /dev/null &
    sleep 1
    echo VMWARDEN-GUEST-READY
    while :; do sleep 3600; done
  '';
in {
  kernel = "${kernelPackage}/${pkgs.stdenv.hostPlatform.linux-kernel.target}";
  initrd = "${pkgs.makeInitrdNG {
    name = "vmwarden-test-guest";
    compressor = "gzip";
    contents = [
      {
        source = init;
        target = "/init";
      }
      {
        source = busybox;
        target = "/bin/busybox";
      }
      {
        source = "${pkgs.kmod}/bin/kmod";
        target = "/bin/modprobe";
      }
      {
        source = "${modules}/lib/modules";
        target = "/lib/modules";
      }
      {
        source = powerButton;
        target = "/etc/acpi/PWRF/00000080";
      }
    ];
  }}/initrd";
  # pc under TCG: no tsc_early_khz needed (unlike -machine microvm).
  cmdline = "console=ttyS0 panic=-1";
}
