# Pure helpers shared by options.nix, assertions.nix and host.nix: the
# naming rules, the launch-spec rendering and the systemd unit definitions.
# Nothing here reads `config`; everything takes its inputs as arguments.
# The rules and the units' keys are data in ../units/, which the launcher
# reads too (units/rules.toml, units/*.service.toml, units/*.target.toml).
{lib}: let
  inherit (lib) all filter hasPrefix optional splitString;

  # ../units/rules.toml: what the launcher checks (launcher/build.rs turns
  # the same file into its constants).
  rules = builtins.fromTOML (builtins.readFile ../units/rules.toml);
  # A character class of rules.toml as a regex bracket expression.
  class = c: "[${c}]";

  # "02" -> 2: the value of a MAC octet (the option type checked the hex).
  hexDigits = builtins.listToAttrs (lib.imap0 (value: name: {inherit name value;}) (lib.stringToCharacters "0123456789abcdef"));
  octet = s: 16 * hexDigits.${lib.toLower (builtins.substring 0 1 s)} + hexDigits.${lib.toLower (builtins.substring 1 1 s)};
in rec {
  # ---------------------------------------------------------------- names
  # VM names, as the launcher checks them (ARCHITECTURE.md, launch step 2).
  vmNameRegex = "${class rules.vm_name.first}${class rules.vm_name.rest}{0,${toString (rules.vm_name.max_len - 1)}}";
  validVmName = n: builtins.match vmNameRegex n != null;

  # Unix user and group names the module creates for a VM.
  principalNameRegex = "[a-z_][a-z0-9_-]{0,31}";
  validPrincipalName = n: builtins.match principalNameRegex n != null;

  # Credential names, as the launcher checks them: a file name without ':'
  # (LoadCredential's separator), starting with a letter or digit.
  credNameRegex = "${class rules.credential_name.first}${class rules.credential_name.rest}*";
  validCredName = n: builtins.match credNameRegex n != null;

  # Taps the launcher creates (IFNAMSIZ: 15 bytes), other interface names
  # (bridges), guest MACs; launcher/src/config/names.rs checks the same.
  tapPrefix = rules.tap.prefix;
  ifNameMax = rules.ifname.max_len;
  tapNameRegex = "${lib.escapeRegex tapPrefix}${class rules.tap.rest}{1,${toString (ifNameMax - builtins.stringLength tapPrefix)}}";
  ifNameRegex = "${class rules.ifname.chars}{1,${toString ifNameMax}}";
  # A bridge the launcher accepts: an interface name, not "." or "..", and
  # not one of vmwarden's own taps.
  validBridgeName = n: builtins.match ifNameRegex n != null && !builtins.elem n rules.ifname.refused && !hasPrefix tapPrefix n;
  macRegex = "[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}";
  # Not multicast/broadcast (the first octet's group bit clear), not zero.
  unicastMac = m: let
    group = builtins.bitAnd (octet m) rules.mac.group_bit != 0;
    zero = builtins.match "(00:){5}00" m != null;
  in
    !group && !(rules.mac.refuse_zero && zero);

  # QEMU stores fw_cfg file names in 56 bytes including the NUL.
  fwCfgPrefix = rules.fw_cfg.credential_prefix;
  fwCfgMax = rules.fw_cfg.name_max;
  fwCfgName = c: fwCfgPrefix + c;

  # Groups whose membership would give a VM principal more than its own VM.
  privilegedGroups = rules.groups.privileged;
  # Groups shared with others: never a VM principal's own group.
  sharedGroups = rules.groups.shared;

  # tmpfs `noswap` (credential tmpfs) appeared in Linux 6.4.
  minKernel = "6.4";

  # ---------------------------------------------------------------- paths
  # "/a/b": absolute, no empty, "." or ".." component, no trailing "/";
  # and safe to write unquoted into a unit file (ReadWritePaths=,
  # LoadCredential=): no whitespace, control characters, '%' (specifiers),
  # quotes or backslashes. launcher/src/unit.rs checks the same.
  isNormalAbsolutePath = s:
    builtins.isString s
    && hasPrefix "/" s
    && builtins.match "[^[:space:][:cntrl:]%\"'\\]*" s != null
    && (s == "/" || all (c: c != "" && c != "." && c != "..") (builtins.tail (splitString "/" s)));

  # "identity" or "volumes/root.img": relative, normalised.
  isNormalRelativePath = s:
    builtins.isString s
    && s != ""
    && !hasPrefix "/" s
    && all (c: c != "" && c != "." && c != "..") (splitString "/" s);

  isUnder = dir: p: p == dir || hasPrefix "${dir}/" p;

  # Directories the unit hides from the launcher and the hypervisor
  # (ProtectHome=yes, PrivateTmp=yes): VM files there cannot be opened.
  hiddenDirs = ["/home" "/root" "/run/user" "/tmp" "/var/tmp"];
  hiddenDirOf = p: let
    hits = filter (d: isUnder d p) hiddenDirs;
  in
    if hits == []
    then null
    else builtins.head hits;

  # Every host path a VM's hypervisor opens, with the option that set it.
  vmPaths = name: vm:
    [
      {
        option = "vmwarden.vms.${name}.kernel";
        path = vm.kernel;
      }
    ]
    ++ optional (vm.initrd != null) {
      option = "vmwarden.vms.${name}.initrd";
      path = vm.initrd;
    }
    ++ map (d: {
      option = "vmwarden.vms.${name}.disks";
      inherit (d) path;
    })
    vm.disks
    ++ map (p: {
      option = "vmwarden.vms.${name}.landlock.read";
      path = p;
    })
    vm.landlock.read
    ++ map (p: {
      option = "vmwarden.vms.${name}.landlock.write";
      path = p;
    })
    vm.landlock.write;

  # ---------------------------------------------------------------- spec
  # The launch spec, version 1 (ARCHITECTURE.md "Launch spec"). The launcher
  # rejects unknown fields, so this emits exactly the contract's fields.
  spec = name: vm:
    {
      version = 1;
      inherit name;
      principal = {
        inherit (vm.principal) user group;
      };
      hypervisor = {
        kind = vm.hypervisor;
        binary = vm.hypervisorBinary;
        inherit (vm) accel machine;
      };
      inherit (vm) vcpus kernel cmdline;
      memory_mib = vm.memoryMiB;
      credentials =
        map (c: {
          name = c;
          source.systemd = c;
        })
        (builtins.attrNames vm.credentials);
      disks =
        map (d: {
          inherit (d) path;
          read_only = d.readOnly;
        })
        vm.disks;
      interfaces = map (i:
        {inherit (i) tap;}
        // lib.optionalAttrs (i.bridge != null) {inherit (i) bridge;}
        // lib.optionalAttrs (i.mac != null) {inherit (i) mac;})
      vm.interfaces;
      landlock = {
        inherit (vm.landlock) mode read write;
      };
      keep_on_purge = vm.keepOnPurge;
    }
    // lib.optionalAttrs (vm.initrd != null) {inherit (vm) initrd;};

  # ---------------------------------------------------------------- units
  # `vmwarden render-unit` (launcher/src/unit.rs) prints the same units for
  # hosts without Nix; tests/nix/run.sh compares them key by key
  # (units.py parity).
  # Change both together.

  # microvm@.service. `bin` is the directory holding the three binaries.
  template = bin: {
    description = "vmwarden microVM %i";
    # network.target: stop VMs before the network goes at shutdown.
    # vmwarden-reap-report: the boot-time report sees the last boot's
    # leftovers before any VM starts.
    after = ["network.target" "vmwarden-reap-report.service"];
    before = ["microvms.target"];
    # `systemctl stop/restart microvms.target` stops/restarts every VM.
    partOf = ["microvms.target"];
    # A few crashes in a row mean something is wrong: stop retrying.
    startLimitIntervalSec = 600;
    startLimitBurst = 3;
    # No spec, no VM: `systemctl start microvm@typo` and an instance whose VM
    # was removed from the configuration (its drop-in is gone, so
    # switch-to-configuration restarts it) are skipped, not started.
    unitConfig.ConditionPathExists = "/etc/vmwarden/vms/%i.json";
    # The launcher builds the whole environment it needs.
    path = lib.mkForce [];
    serviceConfig = {
      # exec: the unit fails if vmwarden-launch cannot be executed; the
      # launcher then execve()s the hypervisor, which stays the main process.
      Type = "exec";
      ExecStart = "${bin}/vmwarden-launch %i";
      # '+': outside the sandbox, as full root (it only reads the socket).
      ExecStartPost = "+${bin}/vmwarden wait-ready %i";
      # Graceful: ACPI power-down through the control socket, then quit.
      ExecStop = "${bin}/vmwarden stop %i";
      # '+': cleanup must see every mount namespace and delete anything.
      ExecStopPost = "+${bin}/vmwarden-cleanup %i";
      # mixed: after ExecStop returns, SIGTERM goes to the hypervisor only
      # (it owns any helper it spawned and tears it down itself), then
      # SIGKILL to whatever is left in the cgroup, so nothing outlives the
      # unit and ExecStopPost runs with every VM process gone.
      KillMode = "mixed";
      # A guest boot under TCG (or a loaded host at boot) is slow.
      TimeoutStartSec = 300;
      # ExecStop's own deadline (vmwarden stop) must end before this.
      TimeoutStopSec = 150;
      # on-failure: a hypervisor crash or OOM kill restarts the VM (cleanup
      # runs in between, so each start begins from a clean slate); a guest
      # that powers itself off (exit 0) stays off, unlike Restart=always.
      Restart = "on-failure";
      RestartSec = "5s";
      # 78 (EX_CONFIG): the launcher refused the spec; retrying cannot help.
      RestartPreventExitStatus = 78;
      SyslogIdentifier = "microvm@%i";
      Slice = "machine.slice";

      # ---- hardening that does not fight the launcher ----
      # The launcher starts as root and drops to the VM principal itself;
      # these are the only capabilities it uses: unshare + mounts
      # (SYS_ADMIN), the drop (SETUID, SETGID, SETPCAP for the bounding set
      # and securebits), runtime/state dirs and credential files owned by the
      # principal (CHOWN, FOWNER, DAC_OVERRIDE); and ExecStop's last resort,
      # SIGKILL of the hypervisor, which runs as another uid (KILL). Taps
      # (NET_ADMIN, AF_NETLINK) belong in the per-VM drop-in of VMs that
      # have interfaces: both settings merge across drop-ins.
      CapabilityBoundingSet = "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL CAP_SETGID CAP_SETPCAP CAP_SETUID CAP_SYS_ADMIN";
      NoNewPrivileges = true;
      # /run/vmwarden and /var/lib/vmwarden must exist before the namespace
      # is built: systemd creates them (0755 root) and makes them writable;
      # the launcher creates and owns everything below. Preserved, because
      # the per-VM directories outlive each run.
      RuntimeDirectory = "vmwarden";
      RuntimeDirectoryMode = "0755";
      RuntimeDirectoryPreserve = true;
      StateDirectory = "vmwarden";
      StateDirectoryMode = "0755";
      ProtectSystem = "strict";
      ProtectHome = true;
      PrivateTmp = true;
      PrivateIPC = true;
      # The unit's own mount namespace; the launcher's credential tmpfs lives
      # in a further one below it.
      PrivateMounts = true;
      # PrivateDevices would hide /dev/kvm; a closed device policy instead.
      DevicePolicy = "closed";
      DeviceAllow = [
        "/dev/kvm rw"
        "/dev/net/tun rw"
        "/dev/vhost-net rw"
        "/dev/vhost-vsock rw"
      ];
      ProtectKernelTunables = true;
      ProtectKernelModules = true;
      ProtectKernelLogs = true;
      ProtectControlGroups = true;
      ProtectClock = true;
      ProtectHostname = true;
      # ProtectProc=invisible is left out on purpose: it would hide the VM
      # principal's processes from the launcher's liveness probe (root has
      # no CAP_SYS_PTRACE here), turning "live" into a false "dead".
      # ProcSubset=pid too: it hides /proc/mounts, /proc/sys and the like,
      # which the launcher and QEMU read.
      # The launcher makes its own mount namespace, nothing else.
      RestrictNamespaces = "mnt";
      # The control socket (and NSS lookups); no IP or netlink sockets.
      RestrictAddressFamilies = "AF_UNIX";
      IPAddressDeny = "any";
      RestrictRealtime = true;
      RestrictSUIDSGID = true;
      LockPersonality = true;
      # MemoryDenyWriteExecute is left out on purpose: QEMU's TCG
      # accelerator is a JIT and needs writable+executable memory.
      SystemCallArchitectures = "native";
      # A deny list: the hypervisor inherits this filter, and an allow list
      # that misses one syscall of some QEMU code path kills the VM.
      SystemCallFilter = "~@clock @cpu-emulation @debug @module @obsolete @raw-io @reboot @swap";
      UMask = "0077";
      # Guest memory never lands in a core file (the launcher sets it too).
      LimitCORE = 0;
    };
  };

  # The per-VM drop-in (microvm@<name>.service.d/): credentials and the
  # writable paths outside the state root. `credSource c` is the host file
  # of systemd credential c.
  dropin = vm: credSource: {
    overrideStrategy = "asDropin";
    path = lib.mkForce [];
    serviceConfig =
      {
        LoadCredential = map (c: "${c}:${credSource c}") (builtins.attrNames vm.credentials);
        # '-': a missing image is the launcher's error to report, not a
        # namespace setup failure.
        ReadWritePaths = map (p: "-${p}") (writablePaths vm);
      }
      # Taps: the launcher (root, before its privilege drop) creates them
      # through /dev/net/tun (already in DeviceAllow) and configures them over
      # rtnetlink. Both settings merge with the template's.
      // lib.optionalAttrs (vm.interfaces != []) {
        CapabilityBoundingSet = "CAP_NET_ADMIN";
        RestrictAddressFamilies = "AF_NETLINK";
      };
  };

  writablePaths = vm: map (d: d.path) (filter (d: !d.readOnly) vm.disks) ++ vm.landlock.write;

  # microvms.target: the autostart VMs (wants) come from the module.
  target = {
    description = "vmwarden microVMs";
    wantedBy = ["multi-user.target"];
  };

  # Boot-time dry run of `vmwarden reap`: what a previous boot left behind,
  # in the journal; deletes nothing.
  reapReport = bin: {
    description = "vmwarden: report leftovers of stopped or removed microVMs (dry run)";
    wantedBy = ["multi-user.target"];
    after = ["local-fs.target"];
    before = ["microvms.target"];
    path = lib.mkForce [];
    serviceConfig = {
      Type = "oneshot";
      ExecStart = "${bin}/vmwarden reap";
      # Reads /proc, mountinfo, netlink and the registry; writes nothing.
      CapabilityBoundingSet = "CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_SYS_PTRACE";
      NoNewPrivileges = true;
      ProtectSystem = "strict";
      ProtectHome = true;
      PrivateTmp = true;
      PrivateDevices = true;
      ProtectKernelTunables = true;
      ProtectKernelModules = true;
      ProtectKernelLogs = true;
      ProtectControlGroups = true;
      ProtectClock = true;
      ProtectHostname = true;
      RestrictNamespaces = true;
      RestrictAddressFamilies = "AF_UNIX AF_NETLINK";
      IPAddressDeny = "any";
      RestrictRealtime = true;
      RestrictSUIDSGID = true;
      LockPersonality = true;
      MemoryDenyWriteExecute = true;
      SystemCallArchitectures = "native";
      SystemCallFilter = "@system-service";
      UMask = "0077";
    };
  };

  # ---------------------------------------------------------------- misc
  # microvm.nix's host module (nixosModules.host) also defines microvm@.service.
  microvmNixHost = options: config:
    lib.hasAttrByPath ["microvm" "host" "enable"] options
    && (config.microvm.host.enable or false);

  duplicates = xs: lib.unique (filter (x: lib.count (y: y == x) xs > 1) xs);
}
