# A guest declared with microvm.nix's guest module (the flake input
# `microvm`, used by the checks only) and run by vmwarden from
# `vmwarden.vms.g.guest`: booted nested under TCG with the host's
# /nix/store shared over virtiofs, an auto-created /var volume and a
# credential. Then what `nixos-rebuild switch` does (docs/nixos.md,
# "Changing and removing VMs"): an unchanged VM keeps running and the
# boot-time reap report does not run again; a VM stopped by hand is started
# again (autostart); a changed guest restarts its VM, which keeps its
# volume; a removed VM is stopped and reported for purge.
{common}: let
  # The guest: an ordinary microvm.nix guest configuration. Its service
  # prints the markers the other tests' guests print, on the serial console
  # (the VM's journal on the host), and counts its boots on /var.
  guest = extra:
    common.microvmGuest [
      ../microvm-guest.nix
      ({lib, ...}: {
        networking.hostName = "g";
        system.stateVersion = lib.trivial.release;
        systemd.services.vmwarden-test-ready = {
          wantedBy = ["multi-user.target"];
          after = ["local-fs.target"];
          serviceConfig = {
            Type = "oneshot";
            # From the system credential store, where systemd put the fw_cfg
            # credential at boot.
            LoadCredential = "secret";
            StandardOutput = "tty";
            TTYPath = "/dev/ttyS0";
          };
          script = ''
            n=$(( $(cat /var/lib/vmwarden-test/boots 2>/dev/null || echo 0) + 1 ))
            mkdir -p /var/lib/vmwarden-test && echo "$n" > /var/lib/vmwarden-test/boots
            echo "VMWARDEN-CRED name=secret sha256=$(sha256sum < "$CREDENTIALS_DIRECTORY/secret" | cut -d' ' -f1)"
            echo "VMWARDEN-BOOTS $n $(cat /proc/cmdline)"
            echo VMWARDEN-GUEST-READY
          '';
        };
      })
      extra
    ];
  vm = extra: {
    guest = guest extra;
    # Host-side overrides of what the guest says (plain definitions win):
    # the nested guest runs under TCG, where the pc machine needs no
    # tsc_early_khz on the command line.
    accel = "tcg";
    machine = "pc";
  };
in {
  name = "vmwarden-microvm-guest";
  nodes.host = {lib, ...}: {
    imports = [common.host];
    # The nested guest is a whole NixOS (512 MiB) beside the host.
    virtualisation.memorySize = lib.mkForce 3072;
    vmwarden.vms = lib.mkForce {g = vm {};};
    systemd.services.test-secret-g = {
      wantedBy = ["multi-user.target"];
      before = ["microvms.target" "microvm@g.service"];
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
      };
      script = ''
        install -d -m 0700 /run/secrets
        head -c 48 /dev/urandom | base64 > /run/secrets/g
        chmod 0400 /run/secrets/g
      '';
    };
    specialisation = {
      changed.configuration.vmwarden.vms = lib.mkForce {g = vm {boot.kernelParams = ["vmwarden.test=changed"];};};
      removed.configuration.vmwarden.vms = lib.mkForce {};
    };
  };
  testScript =
    builtins.readFile ./prelude.py
    + ''
      def ready(count):
          host.wait_for_unit("microvm@g.service")
          host.wait_until_succeeds(
              f"test $({journal(host, 'g')} | grep -c VMWARDEN-GUEST-READY) -ge {count}",
              timeout=900,
          )

      def boots():
          return host.succeed(f"{journal(host, 'g')} | grep VMWARDEN-BOOTS | tail -1").split()

      def report_invocation():
          return host.succeed("systemctl show -p InvocationID --value vmwarden-reap-report.service").strip()

      start_all()
      base = host.succeed("readlink -f /run/current-system").strip()

      with subtest("the guest boots from the shared store, with its volume and credential"):
          ready(1)
          assert_credential_reached_guest(host, "g")
          assert boots()[1] == "1", boots()
          host.succeed("test \"$(stat -c '%U %a' /var/lib/vmwarden/g/var.img)\" = 'vm-g 600'")
          host.succeed("grep -q ro-store /etc/vmwarden/vms/g.json")
          assert qmp_status(host, "g") == "running"

      with subtest("an unchanged switch restarts nothing and does not re-run the reap report"):
          host.succeed("systemctl is-active vmwarden-reap-report.service")
          pid, report = hypervisor_pid(host, "g"), report_invocation()
          host.succeed("/run/current-system/bin/switch-to-configuration test")
          assert hypervisor_pid(host, "g") == pid, "g was restarted"
          assert report_invocation() == report, "the reap report ran again"

      with subtest("a VM stopped by hand is started again by the next switch (autostart)"):
          host.succeed("systemctl stop microvm@g.service")
          host.succeed("vmwarden verify-clean g")
          host.succeed("/run/current-system/bin/switch-to-configuration test")
          ready(2)
          assert boots()[1] == "2", boots()

      with subtest("a changed guest restarts its VM, which keeps its volume"):
          pid = hypervisor_pid(host, "g")
          host.succeed(f"{base}/specialisation/changed/bin/switch-to-configuration test")
          ready(3)
          assert hypervisor_pid(host, "g") != pid, "g was not restarted"
          b = boots()
          assert b[1] == "3" and "vmwarden.test=changed" in b, b
          host.succeed("vmwarden status g")

      with subtest("a removed VM is stopped and reported for purge"):
          out = host.succeed(f"{base}/specialisation/removed/bin/switch-to-configuration test 2>&1")
          assert "vmwarden: VM g is no longer configured; its state is in /var/lib/vmwarden/g" in out, out
          host.wait_until_fails("systemctl is-active microvm@g.service")
          host.succeed("test ! -e /etc/vmwarden/vms/g.json")
          host.succeed("vmwarden verify-clean g")
          host.succeed("test -f /var/lib/vmwarden/g/var.img")
    '';
}
