#!/bin/sh
# smoke unit's ExecStop: ACPI power button through QMP, then wait (<=30 s) for the hypervisor
sock=$1 pid=$2
printf '%s\n%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"system_powerdown"}' | nc -U -q 1 "$sock" >/dev/null
i=0
while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
