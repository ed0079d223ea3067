# Two VMs running under systemd: each hypervisor runs as its own principal
# with no capabilities, in its own mount namespace with its credential
# tmpfs (noswap) invisible to the host; entered as that principal in that
# namespace, it reaches its own files and nothing of the other VM's.
{common}: {
  name = "vmwarden-isolation";
  nodes.host = common.host;
  testScript =
    builtins.readFile ./prelude.py
    + ''
      start_all()
      for vm in ["a", "b"]:
          wait_guest_ready(host, vm)


      def proc_status(pid):
          lines = host.succeed(f"cat /proc/{pid}/status").splitlines()
          return dict(line.split(":", 1) for line in lines if ":" in line)


      host_ns = host.succeed("readlink /proc/1/ns/mnt").strip()

      for vm, other in [("a", "b"), ("b", "a")]:
          pid = hypervisor_pid(host, vm)
          with subtest(f"{vm}: the hypervisor holds nothing but its own VM"):
              st = proc_status(pid)
              uid = host.succeed(f"id -u vm-{vm}").strip()
              gid = host.succeed(f"id -g vm-{vm}").strip()
              assert st["Uid"].split() == [uid] * 4, st["Uid"]
              assert st["Gid"].split() == [gid] * 4, st["Gid"]
              for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]:
                  assert int(st[cap].strip(), 16) == 0, f"{cap}={st[cap].strip()}"
              assert st["NoNewPrivs"].strip() == "1"
              assert host.succeed(f"readlink /proc/{pid}/ns/mnt").strip() != host_ns
              mounts = host.succeed(f"cat /proc/{pid}/mountinfo").splitlines()
              creds = [m for m in mounts if f"/run/vmwarden/{vm}/credentials" in m]
              assert creds and all("noswap" in m for m in creds), creds
              host.fail(f"grep -q /run/vmwarden/{vm}/credentials /proc/1/mountinfo")
              host.fail(f"grep -qaF \"$(cat /run/secrets/{vm})\" /proc/{pid}/cmdline /proc/{pid}/environ")

          enter = f"nsenter --target {pid} --mount setpriv --reuid=vm-{vm} --regid=vm-{vm} --clear-groups --"
          with subtest(f"{vm}: its principal reaches its own files only"):
              host.succeed(f"{enter} cat /run/vmwarden/{vm}/credentials/secret")
              host.succeed(f"{enter} sh -c 'touch /var/lib/vmwarden/{vm}/probe && rm /var/lib/vmwarden/{vm}/probe'")
              host.fail(f"{enter} cat /run/vmwarden/{other}/credentials/secret")
              host.fail(f"{enter} ls /var/lib/vmwarden/{other}")
              host.fail(f"{enter} ls /run/vmwarden/{other}/control")
              host.fail(f"{enter} cat /run/credentials/microvm@{vm}.service/secret")
              host.fail(f"{enter} cat /run/secrets/{other}")
              host.fail(f"{enter} cat /etc/shadow")
              host.fail(f"{enter} touch /etc/vmwarden-probe")
    '';
}
