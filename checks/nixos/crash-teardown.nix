# SIGKILL to the whole unit: systemd sees the failure, ExecStopPost cleans
# up, Restart=on-failure brings the VM back from a clean slate; a later
# stop is clean.
{common}: {
  name = "vmwarden-crash-teardown";
  nodes.host = common.host;
  testScript =
    builtins.readFile ./prelude.py
    + ''
      start_all()
      wait_guest_ready(host, "a")
      old = hypervisor_pid(host, "a")

      with subtest("kill -9: cleanup runs, the VM restarts"):
          host.succeed("systemctl kill -s KILL microvm@a.service")
          wait_guest_ready(host, "a", count=2)
          new = hypervisor_pid(host, "a")
          assert new != old, "the hypervisor was not restarted"
          host.fail(f"kill -0 {old}")
          host.succeed("test $(systemctl show -p NRestarts --value microvm@a.service) -ge 1")
          host.succeed("systemctl show -p ExecStopPost microvm@a.service | grep -q 'status=0/0'")
          assert qmp_status(host, "a") == "running"
          assert_credential_reached_guest(host, "a")

      with subtest("kill -9 of the hypervisor alone, then stop: clean"):
          host.succeed(f"kill -9 {hypervisor_pid(host, 'a')}")
          wait_guest_ready(host, "a", count=3)
          host.succeed("systemctl stop microvm@a.service")
          host.succeed("vmwarden verify-clean a")
    '';
}
