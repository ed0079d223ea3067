# Two VMs start at boot, pass wait-ready, run (QMP), see their credential;
# a stop is a graceful power-down and verify-clean finds nothing left.
{common}: {
  name = "vmwarden-startup-shutdown";
  nodes.host = common.host;
  testScript =
    builtins.readFile ./prelude.py
    + ''
      start_all()
      host.wait_for_unit("microvms.target")

      for vm in ["a", "b"]:
          with subtest(f"{vm}: ready, running, credential delivered"):
              wait_guest_ready(host, vm)
              status = qmp_status(host, vm)
              assert status == "running", f"{vm}: QMP status {status}"
              assert_credential_reached_guest(host, vm)

      with subtest("stop is a graceful power-down and leaves nothing behind"):
          for vm in ["a", "b"]:
              host.succeed(f"systemctl stop microvm@{vm}.service")
              host.succeed(f"{journal(host, vm)} | grep -q VMWARDEN-GUEST-POWERBUTTON")
              host.succeed(f"systemctl show -p ExecStopPost microvm@{vm}.service | grep -q 'status=0/0'")
          host.succeed("vmwarden verify-clean a b")

      with subtest("start again after a clean stop"):
          host.succeed("systemctl start microvm@a.service")
          wait_guest_ready(host, "a", count=2)
          host.succeed("systemctl stop microvms.target")
          host.wait_until_fails("systemctl is-active microvm@a.service")
          host.succeed("vmwarden verify-clean a b")
    '';
}
