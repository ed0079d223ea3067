# Sourced by build-guest.sh and build-guest-shares.sh (not run on its own):
# the steps the two test guests share. The sourcing script sets, before
# calling guest_begin:
#
#   HERE, SELF       its directory and its own path
#   ASSETS           the output directory
#   ASSETS_VAR       the variable that moves it (for messages)
#   STAMP            the cache stamp's path
#   HASHED=(...)     files besides itself, this lib and guest-cmdline.sh
#                    whose content is part of the cache key
#   TOOLS=(...)      commands it needs besides the common ones
#
# then calls, in order:
#
#   guest_begin "$@"             --force; cache hit: print assets.env and exit;
#                                else the lock, $WORK, $BUSYBOX
#   guest_kernel META            KPKG, KVER, MODDIR from META's dependency
#   guest_modules MOD...         ORDER (load order, dependencies first), KO_PATH
#   guest_initramfs_base         $R: busybox, the modules, /dev nodes, acpid's handler
#   guest_init <EXTRA            $R/init, with the /init lines on its stdin
#                                (</dev/null: none) after the markers, before READY
#   guest_pack                   $WORK/initramfs.img and $WORK/vmlinuz
#   guest_assets_env             $WORK/assets.env
#   guest_publish                rename into place, stamp, print assets.env
#
# between which it adds its own files to $R.

SCRIPT_NAME=${SELF##*/}
LIB="$HERE/lib-guest.sh"
CMDLINE_HELPER="$HERE/guest-cmdline.sh"
OUTPUTS=(vmlinuz initramfs.img assets.env)

die() { echo "$SCRIPT_NAME: ERROR: $*" >&2; exit 1; }
log() { echo "$SCRIPT_NAME: $*" >&2; }

want_hash() { cat "$SELF" "$LIB" "$CMDLINE_HELPER" "${HASHED[@]}" | sha256sum | cut -d' ' -f1; }

is_cached() {
  local f
  [ "$FORCE" -eq 0 ] || return 1
  [ -r "$STAMP" ] || return 1
  for f in "${OUTPUTS[@]}"; do [ -s "$ASSETS/$f" ] || return 1; done
  [ "$(cat "$STAMP")" = "$WANT" ]
}

guest_begin() {
  local c
  FORCE=0
  case "${1:-}" in
    "") ;;
    --force) FORCE=1 ;;
    *) die "usage: $0 [--force]" ;;
  esac

  [ -r "$CMDLINE_HELPER" ] || die "missing $CMDLINE_HELPER"

  WANT=$(want_hash)
  # Fast path (no lock, no apt): a cache hit costs two sha256sums.
  if is_cached; then
    echo "$ASSETS/assets.env"
    exit 0
  fi

  for c in apt-get apt-cache dpkg-deb busybox modinfo gzip sha256sum flock "${TOOLS[@]}"; do
    command -v "$c" >/dev/null 2>&1 || die "'$c' not found (run tests/setup-host.sh as root)"
  done
  busybox cpio --help >/dev/null 2>&1 || die "busybox has no cpio applet (need busybox-static)"
  BUSYBOX=$(command -v busybox)
  file -L "$BUSYBOX" 2>/dev/null | grep -q 'dynamically linked' \
    && die "$BUSYBOX is dynamically linked; install busybox-static"

  mkdir -p "$ASSETS" || die "cannot create $ASSETS"
  chmod 0755 "$ASSETS" || die "cannot chmod $ASSETS"
  [ -w "$ASSETS" ] || die "$ASSETS is not writable (run as root or set $ASSETS_VAR)"

  exec 9>"$ASSETS/.lock" || die "cannot open $ASSETS/.lock"
  flock 9
  # Somebody else may have finished the build while we waited for the lock.
  if is_cached; then
    echo "$ASSETS/assets.env"
    exit 0
  fi

  # We hold the lock: leftovers of killed builds can go.
  rm -rf "$ASSETS"/.build.*
  rm -f "$STAMP"
  WORK=$(mktemp -d "$ASSETS/.build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  t0=$(date +%s%N)
}

# ---------------------------------------------------------------- kernel
guest_kernel() {
  local meta=$1 deb
  KPKG=$(apt-cache depends "$meta" 2>/dev/null \
          | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
  [ -n "$KPKG" ] || die "cannot resolve the kernel package from 'apt-cache depends $meta' (apt-get update needed?)"
  log "kernel package: $KPKG"
  mkdir "$WORK/deb"
  # -o APT::Sandbox::User=root: the temp dir is not readable by _apt; without this
  # apt downloads as root anyway, with a warning.
  (cd "$WORK/deb" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >&2) \
    || die "apt-get download $KPKG failed"
  deb=$(find "$WORK/deb" -maxdepth 1 -name '*.deb' | head -n1)
  [ -n "$deb" ] || die "apt-get download produced no .deb"
  dpkg-deb -x "$deb" "$WORK/root" || die "dpkg-deb -x $deb failed"
  rm -f "$deb"

  KVER=$(find "$WORK/root/lib/modules" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -n1)
  [ -n "$KVER" ] || die "no lib/modules/<version> in $KPKG"
  [ -f "$WORK/root/boot/vmlinuz-$KVER" ] || die "no boot/vmlinuz-$KVER in $KPKG"
  MODDIR="$WORK/root/lib/modules/$KVER"
}

# ---------------------------------------------------------------- modules
# The wanted modules are the arguments; the load order (dependencies first)
# comes from each .ko's modinfo depends= (the package ships no modules.dep).
declare -A KO_PATH=() STATE=()
ORDER=()
visit() { # depth-first, dependencies before dependents
  local m=${1//-/_} dep deps
  case "${STATE[$m]:-}" in
    done) return 0 ;;
    active) die "module dependency cycle at $m" ;;
  esac
  [ -n "${KO_PATH[$m]:-}" ] || die "module $m not found in $KPKG (built in? compressed?)"
  STATE[$m]="active"
  deps=$(modinfo -F depends "${KO_PATH[$m]}") || die "modinfo ${KO_PATH[$m]} failed"
  for dep in ${deps//,/ }; do visit "$dep"; done
  STATE[$m]="done"
  ORDER+=("$m")
}

guest_modules() {
  local ko b m
  while IFS= read -r -d '' ko; do
    b=${ko##*/}; b=${b%.ko}
    KO_PATH[$b]=$ko
    KO_PATH[${b//-/_}]=$ko
  done < <(find "$MODDIR/kernel" -name '*.ko' -print0)
  for m in "$@"; do visit "$m"; done
  log "module load order: ${ORDER[*]}"
}

# ---------------------------------------------------------------- initramfs
guest_initramfs_base() {
  local m
  R="$WORK/initramfs"
  mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,run,lib/modules,etc/acpi/PWRF}
  cp "$BUSYBOX" "$R/bin/busybox"
  for m in "${ORDER[@]}"; do
    cp "${KO_PATH[$m]}" "$R/lib/modules/$m.ko"
    echo "$m" >>"$R/lib/modules/order"
  done
  # /dev/console lets the kernel give /init a console before devtmpfs is mounted.
  # Without root we cannot mknod; /init then reopens /dev/console itself.
  if [ "$(id -u)" -eq 0 ]; then
    mknod -m 600 "$R/dev/console" c 5 1
    mknod -m 666 "$R/dev/null" c 1 3
  fi

  # busybox acpid runs PWRF/00000080 on the ACPI power button (QMP system_powerdown)
  cat >"$R/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/busybox sh
echo "VMWARDEN-GUEST-POWERBUTTON" >/dev/console
/bin/busybox poweroff -f
EOF
  chmod 0755 "$R/etc/acpi/PWRF/00000080" "$R/bin/busybox"
}

# /init: the markers, then the caller's lines from stdin (copied as they are:
# end them with a blank line), then READY and the mode.
guest_init() {
  {
    cat <<'EOF'
#!/bin/busybox sh
# vmwarden test guest. Markers (one line each, on the console = ttyS0):
#   VMWARDEN-CRED name=<NAME> sha256=<hex>   per fw_cfg opt/io.systemd.credentials/<NAME>
#   VMWARDEN-CRED-NONE                       no qemu_fw_cfg or no credentials
#   VMWARDEN-NIC name=<if> mac=<mac>         per network interface (not lo)
#   VMWARDEN-GUEST-READY uptime=<s>
#   VMWARDEN-GUEST-POWERBUTTON               (hold mode) ACPI power button, then poweroff -f
#   VMWARDEN-GUEST-CTRLALTDEL                (hold mode) Ctrl-Alt-Del (the kernel sends
#                                            PID 1 SIGINT), then reboot -f: firecracker's
#                                            SendCtrlAltDel; its VM ends on a reboot
# vmwarden.mode=hold (default) | oneshot (poweroff -f right after READY)
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys

MODE=hold
read -r cmdline </proc/cmdline
for a in $cmdline; do
  case "$a" in vmwarden.mode=*) MODE=${a#vmwarden.mode=} ;; esac
done

# MODULE.PARAM=VALUE on the kernel command line goes to that module's insmod,
# as modprobe would pass it (firecracker declares its virtio-mmio devices as
# virtio_mmio.device=SIZE@BASE:IRQ there)
while read -r m; do
  params=
  for a in $cmdline; do
    case "$a" in "$m".*=*) params="$params ${a#"$m".}" ;; esac
  done
  # shellcheck disable=SC2086
  insmod "/lib/modules/$m.ko" $params || echo "VMWARDEN-GUEST-WARN insmod $m failed"
done </lib/modules/order

CREDS=/sys/firmware/qemu_fw_cfg/by_name/opt/io.systemd.credentials
n=0
for d in "$CREDS"/*; do
  [ -f "$d/raw" ] || continue
  sum=$(sha256sum <"$d/raw") || continue
  echo "VMWARDEN-CRED name=${d##*/} sha256=${sum%% *}"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "VMWARDEN-CRED-NONE"

for d in /sys/class/net/*; do
  nic=${d##*/}
  [ "$nic" = lo ] && continue
  [ -r "$d/address" ] || continue
  read -r mac <"$d/address"
  echo "VMWARDEN-NIC name=$nic mac=$mac"
done

EOF
    cat
    cat <<'EOF'
if [ "$MODE" = hold ]; then
  # Ctrl-Alt-Del: firecracker has no ACPI power button; its graceful stop
  # is SendCtrlAltDel (an i8042 key sequence). The kernel reboots at once on
  # it unless told to signal PID 1 instead (as systemd tells it); a reboot
  # (reboot=k: through the i8042) then ends a firecracker VM.
  trap 'echo "VMWARDEN-GUEST-CTRLALTDEL"; reboot -f' INT
  echo 0 >/proc/sys/kernel/ctrl-alt-del
  # Start acpid before READY and wait until it holds the input device open:
  # a power button press (QMP system_powerdown) with no reader is lost.
  acpid -f -c /etc/acpi -l /dev/null &
  apid=$!
  acpid_has_input() {
    for fd in /proc/"$apid"/fd/*; do
      case "$(readlink "$fd")" in /dev/input/event*) return 0 ;; esac
    done
    return 1
  }
  if [ -e /dev/input/event0 ]; then
    i=0
    until acpid_has_input; do
      i=$((i + 1))
      if [ "$i" -ge 500 ] || ! kill -0 "$apid" 2>/dev/null; then
        echo "VMWARDEN-GUEST-WARN acpid did not open /dev/input/event*"
        break
      fi
      sleep 0.01
    done
  else
    echo "VMWARDEN-GUEST-WARN no /dev/input/event* (no ACPI power button)"
  fi
fi

read -r up _ </proc/uptime
echo "VMWARDEN-GUEST-READY uptime=$up"

case "$MODE" in
  oneshot)
    poweroff -f ;;
  hold)
    # the sleep runs in the background so that the Ctrl-Alt-Del trap runs
    # at once, not when it ends
    while :; do sleep 3600 & wait $!; done ;;
  *)
    echo "VMWARDEN-GUEST-ERROR unknown vmwarden.mode=$MODE"
    poweroff -f ;;
esac
EOF
  } >"$R/init"
  chmod 0755 "$R/init"
}

guest_pack() {
  (cd "$R" && find . -mindepth 1 | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 2>/dev/null) \
    | gzip -9n >"$WORK/initramfs.img" || die "packing the initramfs failed"
  [ -s "$WORK/initramfs.img" ] || die "empty initramfs"

  mv "$WORK/root/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
}

# ---------------------------------------------------------------- assets.env
# single-quoted values: valid for sh/bash `.` and trivial to parse (KEY='value')
q() {
  case "$1" in *"'"*) die "value with a single quote: $1" ;; esac
  printf "'%s'" "$1"
}
guest_assets_env() {
  {
    echo "# generated by tests/assets/$SCRIPT_NAME; source it from a shell"
    echo "KERNEL=$(q "$ASSETS/vmlinuz")"
    echo "INITRD=$(q "$ASSETS/initramfs.img")"
    echo "KVER=$(q "$KVER")"
    echo "KERNEL_PACKAGE=$(q "$KPKG")"
    echo "MODULES=$(q "${ORDER[*]}")"
    echo "# base kernel cmdline; append vmwarden.mode=oneshot|hold (default hold)"
    echo "GUEST_CMDLINE_BASE=$(q "$("$CMDLINE_HELPER" --base)")"
    echo "# full cmdlines for TCG on this host (microvm adds tsc_early_khz, host-specific:"
    echo "# prefer running tests/assets/guest-cmdline.sh MACHINE MODE [ACCEL] at test time)"
    echo "GUEST_CMDLINE_MICROVM=$(q "$("$CMDLINE_HELPER" microvm hold tcg)")"
    echo "GUEST_CMDLINE_PC=$(q "$("$CMDLINE_HELPER" pc hold tcg)")"
    echo "GUEST_MACHINE_MICROVM=$(q "$("$CMDLINE_HELPER" --machine microvm)")"
    echo "GUEST_MACHINE_PC=$(q "$("$CMDLINE_HELPER" --machine pc)")"
  } >"$WORK/assets.env"
}

# ---------------------------------------------------------------- publish
guest_publish() {
  local f d perm
  for f in "${OUTPUTS[@]}"; do
    chmod 0644 "$WORK/$f"
    mv -f "$WORK/$f" "$ASSETS/$f"
  done
  echo "$WANT" >"$WORK/stamp"
  chmod 0644 "$WORK/stamp"
  mv -f "$WORK/stamp" "$STAMP"

  # QEMU as another uid must be able to traverse every parent directory.
  d=$ASSETS
  while [ "$d" != / ] && [ -n "$d" ]; do
    perm=$(stat -c %A "$d")
    [ "${perm:9:1}" = x ] || [ "${perm:9:1}" = t ] \
      || log "WARNING: $d is not world-searchable ($perm); an unprivileged QEMU cannot read the assets"
    d=$(dirname "$d")
  done

  log "built $KVER in $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(stat -c %s "$ASSETS/vmlinuz") B kernel, $(stat -c %s "$ASSETS/initramfs.img") B initramfs"
  echo "$ASSETS/assets.env"
}
