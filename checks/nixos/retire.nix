# A specialisation without VM b: switching to it stops b (its spec and
# drop-in are gone) and leaves a running; reap reports b's runtime root,
# reap --apply removes it, purge empties b's state directory.
{common}: {
  name = "vmwarden-retire";
  nodes.host = {lib, ...}: {
    imports = [common.host];
    specialisation.retired.configuration.vmwarden.vms = lib.mkForce {a = common.vm "a";};
  };
  testScript =
    builtins.readFile ./prelude.py
    + ''
      start_all()
      for vm in ["a", "b"]:
          wait_guest_ready(host, vm)
      a_pid = hypervisor_pid(host, "a")

      with subtest("switching to a configuration without b stops b only"):
          host.succeed("/run/current-system/specialisation/retired/bin/switch-to-configuration test")
          host.wait_until_fails("systemctl is-active microvm@b.service")
          host.succeed("test ! -e /etc/vmwarden/vms/b.json")
          host.succeed(f"{journal(host, 'b')} | grep -q VMWARDEN-GUEST-POWERBUTTON")
          assert hypervisor_pid(host, "a") == a_pid, "a was restarted"
          host.succeed("vmwarden verify-clean b")

      with subtest("reap reports the retired VM, --apply removes its runtime root"):
          report = host.succeed("vmwarden reap")
          assert "/run/vmwarden/b" in report, report
          host.succeed("vmwarden reap --apply")
          host.fail("test -n \"$(ls -A /run/vmwarden/b 2>/dev/null)\"")
          assert hypervisor_pid(host, "a") == a_pid, "reap touched a"

      with subtest("purge needs the phrase on a terminal, then empties b's state"):
          host.fail("echo DELETE-EVERYTHING | vmwarden purge b")
          host.succeed("printf 'DELETE-EVERYTHING\\n' | script -qec 'vmwarden purge b' /dev/null")
          host.succeed("test -d /var/lib/vmwarden/b")
          host.succeed("test -z \"$(ls -A /var/lib/vmwarden/b)\"")
          host.succeed("vmwarden verify-clean b")
    '';
}
