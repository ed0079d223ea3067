#!/usr/bin/env bash
# Print what QEMU needs to run the vmwarden test guest (see README.md).
#
#   guest-cmdline.sh MACHINE [MODE] [ACCEL]  kernel command line (-append)
#   guest-cmdline.sh --machine MACHINE       value for -machine
#   guest-cmdline.sh --base                  base kernel command line
#
# MACHINE: microvm | pc | q35, optionally with ",opt=val..." (only the type
#          before the first comma matters for the kernel command line)
# MODE:    hold (default) | oneshot
# ACCEL:   tcg (default) | kvm
#
# microvm under TCG needs tsc_early_khz=<host cpu MHz * 1000>, or the guest
# hangs ~9 boots in 10 after "tsc: Marking TSC unstable" (no HPET/PM timer).
# Override the value with TSC_EARLY_KHZ=... .
# microvm needs ACPI (QEMU's default acpi=auto means on; --machine makes it
# explicit): the cloud kernel's qemu_fw_cfg only binds to the ACPI QEMU0002
# device (CONFIG_FW_CFG_SYSFS_CMDLINE is off, so there is no
# qemu_fw_cfg.ioport= parameter), and the power button is an ACPI device too.
set -euo pipefail

die() { echo "guest-cmdline.sh: ERROR: $*" >&2; exit 2; }
BASE="console=ttyS0 quiet panic=-1"

host_tsc_khz() {
  if [ -n "${TSC_EARLY_KHZ:-}" ]; then
    echo "$TSC_EARLY_KHZ"
    return
  fi
  local khz
  khz=$(awk -F: '/^cpu MHz/ { printf "%d", $2 * 1000; exit }' /proc/cpuinfo)
  [ -n "$khz" ] && [ "$khz" -gt 0 ] \
    || die "no 'cpu MHz' in /proc/cpuinfo; set TSC_EARLY_KHZ=<host TSC kHz>"
  echo "$khz"
}

case "${1:-}" in
  --base)
    echo "$BASE" ;;
  --machine)
    [ -n "${2:-}" ] || die "usage: $0 --machine MACHINE"
    m=$2
    case "$m" in
      microvm*acpi=off*) die "microvm with acpi=off: no fw_cfg credentials, no power button" ;;
      microvm*acpi=*) echo "$m" ;;
      microvm*) echo "$m,acpi=on" ;;
      *) echo "$m" ;;
    esac ;;
  "" | -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2 ;;
  *)
    type=${1%%,*}
    mode=${2:-hold}
    accel=${3:-tcg}
    case "$mode" in hold | oneshot) ;; *) die "mode must be hold or oneshot, not '$mode'" ;; esac
    case "$accel" in tcg | kvm) ;; *) die "accel must be tcg or kvm, not '$accel'" ;; esac
    case "$type" in microvm | pc | q35 | pc-*) ;;
      *) die "unknown machine type '$type'" ;;
    esac
    line="$BASE vmwarden.mode=$mode"
    if [ "$type" = microvm ] && [ "$accel" = tcg ]; then
      line="$line tsc_early_khz=$(host_tsc_khz)"
    fi
    echo "$line" ;;
esac
