# A broken spec (an unknown field) fails the unit with the launcher's
# message in the journal and leaves nothing; a VM without a spec is not
# started at all.
{common}: {
  name = "vmwarden-bad-spec";
  nodes.host = {
    imports = [common.host];
    environment.etc."vmwarden/vms/broken.json".text = builtins.toJSON {
      version = 1;
      name = "broken";
      principal = {
        user = "vm-broken";
        group = "vm-broken";
      };
      bogus_field = true;
    };
    users.users.vm-broken = {
      isSystemUser = true;
      group = "vm-broken";
    };
    users.groups.vm-broken = {};
  };
  testScript =
    builtins.readFile ./prelude.py
    + ''
      start_all()
      host.wait_for_unit("multi-user.target")

      with subtest("a broken spec fails the unit with a clear message"):
          host.execute("systemctl start microvm@broken.service")
          host.wait_until_succeeds("systemctl is-failed microvm@broken.service", timeout=120)
          host.succeed(f"{journal(host, 'broken')} | grep bogus_field")
          host.fail("pgrep -u vm-broken")
          host.fail("test -n \"$(ls -A /run/vmwarden/broken 2>/dev/null)\"")
          host.succeed("vmwarden verify-clean broken")

      with subtest("no spec: the unit is skipped, not started"):
          host.succeed("systemctl start microvm@nosuch.service")
          host.succeed("test $(systemctl show -p ConditionResult --value microvm@nosuch.service) = no")
          host.fail("test -e /run/vmwarden/nosuch")

      with subtest("the configured VMs are unaffected"):
          wait_guest_ready(host, "a")
          wait_guest_ready(host, "b")
    '';
}
