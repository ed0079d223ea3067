# Helpers shared by the vmwarden nixosTests (prepended to each testScript).
import json


def journal(machine, vm):
    return f"journalctl -b -o cat -u microvm@{vm}.service"


def wait_guest_ready(machine, vm, count=1):
    """The unit is active (wait-ready passed) and the guest printed its
    ready marker `count` times on the serial console (the unit's journal)."""
    machine.wait_for_unit(f"microvm@{vm}.service")
    machine.wait_until_succeeds(
        f"test $({journal(machine, vm)} | grep -c VMWARDEN-GUEST-READY) -ge {count}",
        timeout=300,
    )


def hypervisor_pid(machine, vm):
    pid = machine.succeed(f"systemctl show -p MainPID --value microvm@{vm}.service").strip()
    assert pid not in ("", "0"), f"microvm@{vm} has no main process"
    return pid


def qmp_status(machine, vm):
    """query-status over the VM's QMP socket, as root from the host."""
    out = machine.succeed(
        "printf '%s\\n%s\\n' '{\"execute\":\"qmp_capabilities\"}' '{\"execute\":\"query-status\"}'"
        f" | socat -t 3 - UNIX-CONNECT:/run/vmwarden/{vm}/control/qmp.sock"
    )
    for line in out.splitlines():
        ret = json.loads(line).get("return")
        if isinstance(ret, dict) and "status" in ret:
            return ret["status"]
    raise Exception(f"no query-status answer from {vm}: {out!r}")


def assert_credential_reached_guest(machine, vm):
    want = machine.succeed(f"sha256sum < /run/secrets/{vm}").split()[0]
    machine.wait_until_succeeds(
        f"{journal(machine, vm)} | grep -q 'VMWARDEN-CRED name=secret sha256={want}'",
        timeout=60,
    )
