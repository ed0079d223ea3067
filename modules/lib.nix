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
  # VM names, as the launcher checks them (docs/launch-spec.md, `name`).
  vmNameRegex = "${class rules.vm_name.first}${class rules.vm_name.rest}{0,${toString (rules.vm_name.max_len - 1)}}";
  validVmName = n: builtins.match vmNameRegex n != null;

  # Unix user and group names the module creates for a VM. At most 31
  # bytes: NixOS's users-groups.nix aborts (not an assertion: evaluation
  # stops there) on a user or group name of 32 bytes or more.
  principalNameRegex = "[a-z_][a-z0-9_-]{0,30}";
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

  # ---------------------------------------------------------------- roots
  # The launcher's default roots (launcher/src/config/paths.rs).
  stateRoot = "/var/lib/vmwarden";
  runtimeRoot = "/run/vmwarden";
  stateDirOf = name: "${stateRoot}/${name}";
  controlDirOf = name: "${runtimeRoot}/${name}/control";

  # ---------------------------------------------------------------- shares, disks, vsock
  # Share tags become QEMU's 9p mount_tag (at most 31 bytes) and the
  # virtio-fs tag, inside QEMU's key=value argument lists: no ',' or '='.
  shareTagMax = 31;
  shareTagRegex = "[A-Za-z0-9_.-]+";
  validShareTag = t: builtins.match shareTagRegex t != null && builtins.stringLength t <= shareTagMax;

  # Disk serials: virtio-blk keeps 20 bytes (VIRTIO_BLK_ID_BYTES), and the
  # serial stands in QEMU's -drive argument list.
  serialRegex = "[A-Za-z0-9_.-]{1,20}";
  validSerial = s: builtins.match serialRegex s != null;

  # File systems disks.*.create can make (the launcher runs the mkfs as the
  # VM's principal inside its sandbox).
  createFsTypes = ["ext4"];

  # vsock CIDs: 0 is the hypervisor, 1 loopback, 2 the host; 2^32-1 is
  # VMADDR_CID_ANY.
  # nixpkgs' cloud-hypervisor with the `fw_cfg` feature (credentials as
  # fw_cfg files), which nixpkgs does not turn on: buildRustPackage passes
  # cargoBuildFeatures to `cargo build` and cargoCheckFeatures to its tests.
  cloudHypervisorWithFwCfg = ch:
    ch.overrideAttrs (o: {
      cargoBuildFeatures = (o.cargoBuildFeatures or []) ++ ["fw_cfg"];
      cargoCheckFeatures = (o.cargoCheckFeatures or []) ++ ["fw_cfg"];
    });

  vsockCidMin = 3;
  vsockCidMax = 4294967294;
  validCid = c: c >= vsockCidMin && c <= vsockCidMax;
  # The guest's notify socket's default host port (microvm.nix's), and the
  # highest vsock port (2^32-1 is VMADDR_PORT_ANY).
  vmmNotifyPort = 8888;
  vsockPortMax = 4294967294;

  # QEMU machine types and the qemu-system-<arch> that has them.
  machineArch = {
    microvm = "x86_64";
    pc = "x86_64";
    q35 = "x86_64";
    virt = "aarch64";
  };
  # The architecture of a hypervisorBinary named qemu-system-<arch>, else
  # `default` (the host's).
  qemuBinaryArch = default: binary: let
    m = builtins.match ".*/qemu-system-([a-z0-9_]+)" binary;
  in
    if m == null
    then default
    else builtins.head m;

  # ---------------------------------------------------------------- extraArgs
  # hypervisor.extra_args: passed after vmwarden's own arguments, so an
  # argument here can undo what those set up. What each hypervisor refuses,
  # with the reason; launcher/src checks the same.
  #
  # `extraArgsProblems kind name args` is a list of messages, one per
  # refused argument. Options are matched whether written -opt or --opt
  # (QEMU) or --opt=value (cloud-hypervisor, firecracker); every element is
  # looked at, also where it is another option's value.
  extraArgsProblems = kind: name: args: let
    n = builtins.length args;
    at = i: builtins.elemAt args i;
    control = controlDirOf name;
    # "--x" -> "-x" (QEMU takes both); "--x=v" -> "--x" (clap's form).
    qemuOpt = a:
      if hasPrefix "--" a
      then builtins.substring 1 (builtins.stringLength a) a
      else a;
    longOpt = a: builtins.head (splitString "=" a);
    inControl = p: isNormalAbsolutePath p && hasPrefix "${control}/" p;
    shown = a: builtins.toJSON a;
    # A key=value list as QEMU's option parser reads it (launcher/src/config/
    # extra_args.rs, `keyval`, does the same): split at ",", where ",," is a
    # literal comma (left to right); a first element without "=" is the
    # implied key's value, any other one a flag ("x" is x=on, "nox" x=off).
    # { ok = [ { k; v; } ... ]; } or { err = why; }: a control character,
    # ",," in a key and a key given twice cannot be read for sure.
    esc = builtins.fromJSON ''"\u0001"'';
    cntrl = builtins.fromJSON ''"[\u0001-\u001f\u007f]"'';
    keyval = s: implied: let
      elems = splitString "," (builtins.replaceStrings [",,"] [esc] s);
      unesc = builtins.replaceStrings [esc] [","];
      pair = i: e: let
        m = builtins.match "([^=]*)=(.*)" e;
      in
        if m != null
        then {
          k = builtins.head m;
          v = unesc (builtins.elemAt m 1);
        }
        else if implied != null && i == 0
        then {
          k = implied;
          v = unesc e;
        }
        else if hasPrefix "no" e
        then {
          k = lib.removePrefix "no" e;
          v = "off";
        }
        else {
          k = e;
          v = "on";
        };
      # A trailing "," ends the list; only the first element may be empty.
      pairs = lib.imap0 pair (lib.ifilter0 (i: e: i == 0 || e != "") elems);
      keys = map (p: p.k) pairs;
      escapedKey = lib.findFirst (k: lib.hasInfix esc k) null keys;
      dup = lib.findFirst (k: lib.count (x: x == k) keys > 1) null keys;
    in
      if builtins.match ".*${cntrl}.*" s != null
      then {err = "it holds a control character";}
      else if escapedKey != null
      then {err = "the key ${shown (builtins.replaceStrings [esc] [",,"] escapedKey)} holds \",,\", which QEMU does not read as a comma there";}
      else if dup != null
      then {err = "${shown dup} is given twice; QEMU takes the last, write it once";}
      else {ok = pairs;};
    get = k: kv: let
      hits = filter (p: p.k == k) kv;
    in
      if hits == []
      then null
      else (builtins.head hits).v;
    abstractOn = kv: let
      a = get "abstract" kv;
    in
      a != null && !builtins.elem a ["off" "no" "false" "n"];
    jsonForm = s: hasPrefix "{" s;
    jsonWhy = "write it in the key=value form, which these checks read";
    netWhy = "a network socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)";
    # A unix socket chardev (-chardev socket,... and the unix:PATH,...
    # shorthand of -qmp, -monitor, -serial, ...).
    socket = what: kv:
      if get "host" kv != null || get "port" kv != null
      then "a TCP socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)"
      else if abstractOn kv
      then "an abstract socket is reachable from the whole network namespace, not only through control/"
      else if !inControl (toString (get "path" kv))
      then "${what} outside ${control}/ is reachable by others than vmwarden's tools; put it in ${control}/"
      else null;
    # The shorthand: unix:PATH,... (implied key path), mon: before it read
    # through.
    compat = what: v0: let
      v = lib.removePrefix "mon:" v0;
      kv = keyval (lib.removePrefix "unix:" v) "path";
    in
      if builtins.any (p: hasPrefix p v) ["tcp:" "telnet:" "udp:" "websocket:"]
      then netWhy
      else if !hasPrefix "unix:" v
      then null
      else if kv ? err
      then kv.err
      else socket what kv.ok;
    # With a key=value list `v` read with implied key `key`: `f kv`, or
    # why it cannot be read.
    withKv = key: v: f: let
      kv = keyval v key;
    in
      if kv ? err
      then kv.err
      else f kv.ok;

    # ../units/extra-args.toml: the refused options and their reasons,
    # shared with launcher/build.rs; "@control@" is this VM's control/.
    table = builtins.fromTOML (builtins.readFile ../units/extra-args.toml);
    reasons = builtins.mapAttrs (_: builtins.replaceStrings ["@control@"] [control]);
    qemuAlways = reasons table.qemu.always;
    # Options whose value is checked: the value's problem, or null.
    qemuValue = builtins.mapAttrs (o: check:
      {
        inherit monitor chardev netdev;
        fw_cfg = fwCfg;
        chardev_spec = chardevSpec;
      }
      .${
        check
      }
      or (throw "units/extra-args.toml: [qemu.value] ${o} names the unknown check ${check}"))
    table.qemu.value;
    chardev = v:
      if jsonForm v
      then jsonWhy
      else
        withKv "backend" v (kv: let
          b = get "backend" kv;
        in
          if b == null || b == ""
          then "it names no backend"
          else if b == "udp"
          then netWhy
          else if b == "socket"
          then socket "a socket" kv
          else null);
    fwCfg = v:
      withKv "name" v (kv:
        if get "file" kv != null
        then "fw_cfg files are read by QEMU from a host path at start; give the guest a file through `credentials` (a tmpfs of the VM's own), or use string="
        else if hasPrefix fwCfgPrefix (toString (get "name" kv))
        then "names under ${fwCfgPrefix} are vmwarden's credentials; use `credentials`"
        else null);
    monitor = v:
      if v == "none"
      then null
      else if !hasPrefix "unix:" (lib.removePrefix "mon:" v)
      then "a monitor is the VM's control plane; only a unix socket in ${control}/ (or none) keeps it to vmwarden's tools"
      else compat "a monitor socket" v;
    # unix:PATH only in control/; no network sockets; the rest (stdio,
    # null, file:..., pty, ...) stays inside the sandbox.
    chardevSpec = compat "a socket";
    netdev = v:
      if jsonForm v
      then jsonWhy
      else
        withKv "type" v (kv: let
          t = get "type" kv;
        in
          if t == null || t == ""
          then "it names no type"
          else if builtins.elem t ["tap" "bridge"]
          then "QEMU would open a tap (or run the bridge helper) by name; use `interfaces`, whose taps the launcher creates and hands over as file descriptors"
          else if builtins.elem t ["socket" "stream" "dgram"]
          then "QEMU would put the VM's network on a host socket (abstract, outside control/ or IP); use `interfaces`"
          else null);

    chRefused = reasons table.cloud-hypervisor;
    fcRefused = reasons table.firecracker;
    qemuAt = i: let
      a = at i;
      o = qemuOpt a;
    in
      if qemuAlways ? ${o}
      then ["${shown a} is refused: ${qemuAlways.${o}}"]
      else if qemuValue ? ${o}
      then
        if i + 1 >= n
        then ["${shown a} needs a value"]
        else let
          why = qemuValue.${o} (at (i + 1));
        in
          lib.optional (why != null) "${shown a} ${shown (at (i + 1))} is refused: ${why}"
      else [];
    tableAt = table: i: let
      a = at i;
      o = longOpt a;
    in
      lib.optional (table ? ${o}) "${shown a} is refused: ${table.${o}}";
    check =
      {
        qemu = qemuAt;
        cloud-hypervisor = tableAt chRefused;
        firecracker = tableAt fcRefused;
      }
      .${
        kind
      };
  in
    lib.concatMap check (lib.range 0 (n - 1));

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
    vm.landlock.write
    ++ map (s: {
      option = "vmwarden.vms.${name}.shares";
      path = s.source;
    })
    vm.shares;

  # ---------------------------------------------------------------- spec
  # The launch spec, version 1 (docs/launch-spec.md). The launcher
  # rejects unknown fields, so this emits exactly the contract's fields.
  spec = name: vm:
    {
      version = 1;
      inherit name;
      principal = {
        inherit (vm.principal) user group;
      };
      hypervisor =
        {
          kind = vm.hypervisor;
          binary = vm.hypervisorBinary;
          inherit (vm) accel machine;
        }
        // lib.optionalAttrs (vm.extraArgs != []) {extra_args = vm.extraArgs;};
      inherit (vm) vcpus kernel cmdline;
      memory_mib = vm.memoryMiB;
      credentials =
        map (c: {
          name = c;
          source.systemd = c;
        })
        (builtins.attrNames vm.credentials);
      # format, serial, direct, discard and create only when set: the spec of a VM that
      # uses none of them stays byte for byte what it was before they
      # existed (tests/nix/golden), so a rebuild restarts nothing.
      disks = map (d:
        {
          inherit (d) path;
          read_only = d.readOnly;
        }
        // lib.optionalAttrs (d.format != null) {inherit (d) format;}
        // lib.optionalAttrs (d.serial != null) {inherit (d) serial;}
        // lib.optionalAttrs (d.direct != null) {inherit (d) direct;}
        // lib.optionalAttrs (d.discard != null) {inherit (d) discard;}
        // lib.optionalAttrs (d.create != null) {
          create =
            {size_mib = d.create.sizeMiB;}
            // lib.optionalAttrs (d.create.fsType != null) {fs_type = d.create.fsType;};
        })
      vm.disks;
      interfaces = map (i:
        {inherit (i) tap;}
        // lib.optionalAttrs (i.bridge != null) {inherit (i) bridge;}
        // lib.optionalAttrs (i.mac != null) {inherit (i) mac;}
        // lib.optionalAttrs (i.vhost != null) {inherit (i) vhost;}
        // lib.optionalAttrs (i.queues != null) {inherit (i) queues;}
        // lib.optionalAttrs (i.type == "macvtap") {
          inherit (i) type;
          macvtap = {inherit (i.macvtap) link mode;};
        })
      vm.interfaces;
      landlock = {
        inherit (vm.landlock) mode read write;
      };
      keep_on_purge = vm.keepOnPurge;
    }
    // lib.optionalAttrs (vm.initrd != null) {inherit (vm) initrd;}
    // lib.optionalAttrs (vm.shares != []) {
      shares =
        map (s: {
          inherit (s) tag source proto;
          read_only = s.readOnly;
        })
        vm.shares;
    }
    // lib.optionalAttrs (usesVirtiofsd vm) {
      virtiofsd =
        {binary = vm.virtiofsdBinary;}
        // lib.optionalAttrs (vm.virtiofsdThreadPoolSize != null) {thread_pool_size = vm.virtiofsdThreadPoolSize;};
    }
    // lib.optionalAttrs (vm.vsock.cid != null) {
      vsock =
        {inherit (vm.vsock) cid backend;}
        // lib.optionalAttrs (usesVsockDaemon vm) {inherit (vm.vsock) binary;}
        # the guest's notify socket: written only when set, so an existing
        # configuration's spec stays what it was
        // lib.optionalAttrs (vm.vsock.notify != null) {inherit (vm.vsock) notify;}
        // lib.optionalAttrs (vm.vsock.notifyPort != null) {notify_port = vm.vsock.notifyPort;};
    }
    # The host's own tools: each only when on, so an existing
    # configuration's spec stays byte for byte what it was.
    // lib.optionalAttrs vm.balloon {
      balloon = {
        initial_mib = vm.initialBalloonMem;
        deflate_on_oom = vm.deflateOnOOM;
      };
    }
    // lib.optionalAttrs vm.memMerge {mem_merge = true;}
    // lib.optionalAttrs vm.hugepageMem {hugepage_mem = true;}
    // lib.optionalAttrs vm.console {console = true;}
    // lib.optionalAttrs vm.registerWithMachined {register_with_machined = true;}
    // lib.optionalAttrs vm.hibernate.allowed {
      hibernate = {
        allowed = true;
        on_mismatch = vm.hibernate.onMismatch;
      };
    }
    // lib.optionalAttrs vm.userNetwork.enable {user_network = userNetworkSpec vm.userNetwork;}
    // lib.optionalAttrs (vm.devices != []) {devices = map deviceSpec vm.devices;}
    // lib.optionalAttrs vm.allowUnsafeInterrupts {allow_unsafe_interrupts = true;}
    // lib.optionalAttrs (resourcesSpec vm != {}) {resources = resourcesSpec vm;};

  # A device of the spec's `devices` (docs/launch-spec.md).
  deviceSpec = d:
    {inherit (d) bus path;}
    // lib.optionalAttrs (d.id != null) {inherit (d) id;}
    // lib.optionalAttrs (d.qemuBus != null) {qemu_bus = d.qemuBus;}
    // lib.optionalAttrs (d.qemuProperties != []) {qemu_properties = d.qemuProperties;}
    // lib.optionalAttrs d.keepOnVfioPci {keep_on_vfio_pci = true;};

  # The unit's limits (vmwarden.vms.<name>.resources) as the spec's
  # `resources` (set ones only); `render-unit --dropin` reads them there and
  # `dropin` below renders the same lines (launcher/src/config/resources.rs).
  resourcesSpec = vm:
    lib.filterAttrs (_: v: v != null) {
      cpu_quota_percent = vm.resources.cpuQuotaPercent;
      cpu_weight = vm.resources.cpuWeight;
      memory_max_mib = vm.resources.memoryMaxMiB;
      memory_high_mib = vm.resources.memoryHighMiB;
      io_weight = vm.resources.ioWeight;
      tasks_max = vm.resources.tasksMax;
      cpus = vm.resources.cpus;
    };
  resourcesUnit = vm: let
    r = vm.resources;
    set = k: v: f: lib.optionalAttrs (v != null) {${k} = f v;};
    id = v: v;
  in
    set "AllowedCPUs" r.cpus id
    // set "CPUAffinity" r.cpus id
    // set "CPUQuota" r.cpuQuotaPercent (q: "${toString q}%")
    // set "CPUWeight" r.cpuWeight id
    // set "IOWeight" r.ioWeight id
    // set "MemoryHigh" r.memoryHighMiB (m: "${toString m}M")
    // set "MemoryMax" r.memoryMaxMiB (m: "${toString m}M")
    // set "TasksMax" r.tasksMax id;

  # One virtiofsd per virtiofs share (QEMU and cloud-hypervisor alike).
  usesVirtiofsd = vm: builtins.any (s: s.proto == "virtiofs") vm.shares;
  # vhost-device-vsock serves QEMU's user backend; cloud-hypervisor serves
  # its vsock itself, on a unix socket in control/.
  usesVsockDaemon = vm: vm.vsock.cid != null && vm.hypervisor == "qemu" && vm.vsock.backend == "user";
  # The kernel's vhost-vsock: the launcher opens /dev/vhost-vsock as root.
  usesVhostVsock = vm: vm.vsock.cid != null && vm.vsock.backend == "vhost";

  # The devices the launcher opens as root for the hypervisor beyond the
  # template's (`dropin` in launcher/src/unit.rs, in its order).
  deviceAllow = vm:
    lib.optional (usesVhostVsock vm) "/dev/vhost-vsock rw"
    ++ lib.optional (lib.any (i: i.type == "macvtap") vm.interfaces) "char-macvtap rw";
  # The guest's notify socket (config/vmm_notify.rs): firecracker with a
  # vsock, unless turned off; the launcher adds the kernel parameter.
  usesVmmNotify = vm: vm.vsock.cid != null && vm.hypervisor == "firecracker" && vm.vsock.notify != false;
  vmmNotifyParam = vm: "systemd.set_credential=vmm.notify_socket:vsock-stream:2:${toString (
    if vm.vsock.notifyPort == null
    then vmmNotifyPort
    else vm.vsock.notifyPort
  )}";

  # ---------------------------------------------------------------- user network
  # passt's network (units/rules.toml [user_network], which the launcher
  # compiles in) and the launcher's checks of `user_network`, for the
  # module's assertions and the microvm.nix guest derivation.
  userNet = rules.user_network;
  userNetIdRegex = "[A-Za-z][A-Za-z0-9._-]{0,${toString (userNet.id_max - 1)}}";
  # A QEMU id that is none of the taps' netdev ids (net0, net1, ...).
  validUserNetId = id: builtins.match userNetIdRegex id != null && builtins.match "net[0-9]+" id == null;
  # A dotted IPv4 address as the launcher parses it (no leading zeros).
  ipv4Octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  validIPv4 = a: builtins.match "${ipv4Octet}(\\.${ipv4Octet}){3}" a != null;
  # The launcher's checks of forward_ports, each message naming
  # `${at}[i].<field>` (at: the option holding the list).
  forwardPortProblems = at: forwardPorts:
    lib.concatLists (lib.imap0 (i: f: let
      here = "${at}[${toString i}]";
      how = "passt forwards from the guest only to the host's loopback, as the gateway ${userNet.gateway} with the same port: set guest.address = \"${userNet.gateway}\", host.address = \"${userNet.host_loopback}\" and host.port = guest.port (the guest then reaches the host's service at ${userNet.gateway}), or use a tap interface";
      bound = f2: f2.from == "host" && f2.proto == f.proto && f2.host.port == f.host.port && (f2.host.address == f.host.address || builtins.elem "" [f2.host.address f.host.address] || builtins.elem userNet.default_bind [f2.host.address f.host.address]);
      earlier = lib.take i forwardPorts;
    in
      optional (f.host.port == 0) "${here}.host.port = 0: give a port from 1 to 65535"
      ++ optional (f.guest.port == 0) "${here}.guest.port = 0: give a port from 1 to 65535"
      ++ optional (f.host.address != "" && !validIPv4 f.host.address) "${here}.host.address = \"${f.host.address}\": give an IPv4 address (a.b.c.d) or leave it empty"
      ++ optional (f.guest.address != "" && !validIPv4 f.guest.address) "${here}.guest.address = \"${f.guest.address}\": give an IPv4 address (a.b.c.d) or leave it empty"
      ++ lib.optionals (f.from == "host") (
        optional (!builtins.elem f.guest.address ["" userNet.guest_address]) "${here}.guest.address = \"${f.guest.address}\": the guest's only address on the user network is ${userNet.guest_address}, where passt forwards to; leave it empty"
        ++ optional (builtins.any bound earlier) "${here}.host.port = ${toString f.host.port}: ${f.proto} port ${toString f.host.port} is forwarded twice on the same host address; passt can bind it once"
      )
      ++ lib.optionals (f.from == "guest") (
        optional (f.guest.address != userNet.gateway) "${here}.guest.address = \"${f.guest.address}\": ${how}"
        ++ optional (f.guest.address == userNet.gateway && f.host.address != userNet.host_loopback) "${here}.host.address = \"${f.host.address}\": ${how}"
        ++ optional (f.guest.address == userNet.gateway && f.host.address == userNet.host_loopback && f.host.port != f.guest.port) "${here}.host.port = ${toString f.host.port} (guest.port is ${toString f.guest.port}): ${how}"
      ))
    forwardPorts);

  # The spec's user_network (docs/launch-spec.md).
  userNetworkSpec = u:
    {
      inherit (u) binary id;
    }
    // lib.optionalAttrs (u.mac != null) {inherit (u) mac;}
    // lib.optionalAttrs (u.forwardPorts != []) {
      forward_ports =
        map (f: {
          inherit (f) from proto;
          host = {inherit (f.host) address port;};
          guest = {inherit (f.guest) address port;};
        })
        u.forwardPorts;
    };

  # ---------------------------------------------------------------- units
  # The keys of microvm@.service, vmwarden-reap-report.service and
  # microvms.target, each with the reason for it, are data in ../units/*.toml;
  # `vmwarden render-unit` (launcher/src/unit.rs) prints the same data for
  # hosts without Nix. Each key becomes a normal-priority definition, as a
  # host's own would be, so any of them can be overridden with lib.mkForce.
  # tests/nix/run.sh compares the two renderings (units.py parity) and shows
  # that one key changed in the data changes both.

  # [Unit]/[Install] keys NixOS has typed options for. The module defines
  # the option (what a host overrides), not unitConfig; a space-separated
  # string of units becomes the option's list.
  unitListOptions = {
    After = "after";
    Before = "before";
    BindsTo = "bindsTo";
    Conflicts = "conflicts";
    Documentation = "documentation";
    OnFailure = "onFailure";
    OnSuccess = "onSuccess";
    PartOf = "partOf";
    Requires = "requires";
    Requisite = "requisite";
    Upholds = "upholds";
    Wants = "wants";
  };
  installOptions = {
    RequiredBy = "requiredBy";
    UpheldBy = "upheldBy";
    WantedBy = "wantedBy";
  };
  # Typed when the value fits the option's type (int for the start limits).
  unitScalarOptions = {
    Description = "description";
    StartLimitBurst = "startLimitBurst";
    StartLimitIntervalSec = "startLimitIntervalSec";
  };

  # NixOS definitions (systemd.services.<name> or systemd.targets.<name>)
  # from the unit data in ../units/FILE, with the placeholders in `subst`
  # (e.g. {"@bin@" = "/nix/store/...-vmwarden/bin";}) substituted in every
  # string. The same rules as `entries` in launcher/src/unit.rs: sections
  # [Unit], [Service], [Install]; a string, integer or boolean is one line,
  # a list one line per element.
  fromUnitData = subst: file: let
    data = builtins.fromTOML (builtins.readFile (../units + "/${file}"));
    where = "units/${file}";
    scalar = k: v:
      if builtins.isString v
      then builtins.replaceStrings (builtins.attrNames subst) (builtins.attrValues subst) v
      else if builtins.isInt v || builtins.isBool v
      then v
      else throw "${where}: ${k}: a ${builtins.typeOf v} is not a string, integer, boolean or a list of them";
    value = k: v:
      if builtins.isList v
      then map (scalar k) v
      else scalar k v;
    units = k: v:
      if builtins.isString v
      then filter (u: u != "") (splitString " " v)
      else throw "${where}: ${k}: write the units as one space-separated string";
    section = name: lib.mapAttrs value (data.${name} or {});
    unit = section "Unit";
    install = section "Install";
    isTyped = k: v: unitListOptions ? ${k} || (unitScalarOptions ? ${k} && (k == "Description" || builtins.isInt v));
    typed = lib.filterAttrs isTyped unit;
    unitConfig = lib.filterAttrs (k: v: !isTyped k v) unit;
    badSections = builtins.attrNames (removeAttrs data ["Unit" "Service" "Timer" "Install"]);
    badInstall = builtins.attrNames (removeAttrs install (builtins.attrNames installOptions));
  in
    if badSections != []
    then throw "${where}: [${builtins.head badSections}]: the sections are Unit, Service, Timer, Install"
    else if badInstall != []
    then throw "${where}: [Install] ${builtins.head badInstall}: the module knows only ${toString (builtins.attrNames installOptions)}"
    else
      lib.mapAttrs' (k: v:
        if unitListOptions ? ${k}
        then lib.nameValuePair unitListOptions.${k} (units k v)
        else lib.nameValuePair unitScalarOptions.${k} v)
      typed
      // lib.mapAttrs' (k: v: lib.nameValuePair installOptions.${k} (units k v)) install
      // lib.optionalAttrs (unitConfig != {}) {inherit unitConfig;}
      // lib.optionalAttrs (data ? Service) {serviceConfig = section "Service";}
      // lib.optionalAttrs (data ? Timer) {timerConfig = section "Timer";};

  # What NixOS adds to every service on its own, undone: the launcher builds
  # the whole environment it needs (and clears the rest), so nothing here
  # may make the unit differ from render-unit's or restart running VMs.
  nixosServiceDefaults = {
    # NixOS's default PATH of coreutils, findutils, grep, sed and systemd.
    path = lib.mkForce [];
    # systemd.globalEnvironment (nixpkgs nixos/modules/config/locale.nix
    # sets TZDIR, i18n.nix LOCALE_ARCHIVE) goes into every service's text
    # (serviceToUnit in nixos/lib/systemd-lib.nix: globalEnvironment //
    # environment, null values left out): a tzdata or glibc-locales update
    # would change the unit and restart every running VM.
    environment = {
      TZDIR = null;
      LOCALE_ARCHIVE = null;
    };
  };

  # How nixos-rebuild switch treats a changed VM (switch-to-configuration
  # reads these from the merged template + drop-in;
  # docs/design/nixos-rebuild-switch.md). Stop before the activation, with the old unit, the old
  # `vmwarden stop` and cleanup and the old spec under /etc, then start
  # with the new ones: stopIfChanged = false would run the new stop and
  # cleanup against the old instance. Never reload: the unit has no
  # ExecReload=, and switch fails on a drop-in instance it must reload.
  # Spelled out so that a host flipping them meets a conflict, not silence.
  switchBehaviour = {
    stopIfChanged = true;
    reloadIfChanged = false;
  };

  # The template's and the target's names per unit prefix
  # (vmwarden.unitPrefix): ../units/unit-names.toml, which `vmwarden
  # render-unit --prefix` reads too. `unitNames prefix` gives the NixOS
  # attribute names (`service` for systemd.services, `targetAttr` for
  # systemd.targets) and the unit names.
  unitNamesData = builtins.fromTOML (builtins.readFile ../units/unit-names.toml);
  unitPrefixes = builtins.attrNames unitNamesData.prefix;
  unitNames = prefix: let
    target = unitNamesData.prefix.${prefix}.target;
  in {
    inherit prefix target;
    service = "${prefix}@";
    template = "${prefix}@.service";
    instance = name: "${prefix}@${name}.service";
    targetAttr = lib.removeSuffix ".target" target;
    subst = {
      "@prefix@" = prefix;
      "@target@" = target;
    };
  };

  # PREFIX@.service. `bin` is the directory holding the three binaries.
  template = names: bin: fromUnitData ({"@bin@" = bin;} // names.subst) "microvm@.service.toml" // nixosServiceDefaults // switchBehaviour;

  # The per-VM drop-in (microvm@<name>.service.d/): credentials and the
  # writable paths outside the state root. `credSource c` is the host file
  # of systemd credential c.
  dropin = vm: credSource:
    nixosServiceDefaults
    // switchBehaviour
    // {
      overrideStrategy = "asDropin";
    }
    # The host's own tools: the launcher registers the VM with
    # systemd-machined over the system bus, so machined comes first.
    // lib.optionalAttrs vm.registerWithMachined {
      after = ["systemd-machined.service"];
      wants = ["systemd-machined.service"];
    }
    // {
      serviceConfig =
        {
          LoadCredential = map (c: "${c}:${credSource c}") (builtins.attrNames vm.credentials);
          # '-': a missing image is the launcher's error to report, not a
          # namespace setup failure.
          ReadWritePaths = map (p: "-${p}") (writablePaths vm) ++ lib.optional (usesPci vm) "/sys/bus/pci /sys/devices";
        }
        # The unit's limits (resources), as the spec carries them.
        // resourcesUnit vm
        # Taps: the launcher (root, before its privilege drop) creates them
        # through /dev/net/tun (already in DeviceAllow) and configures them over
        # rtnetlink. Both settings merge with the template's.
        // lib.optionalAttrs (vm.interfaces != []) {
          CapabilityBoundingSet = "CAP_NET_ADMIN";
          RestrictAddressFamilies = "AF_NETLINK";
        }
        # vsock with the kernel backend: the launcher (root, in this unit)
        # opens /dev/vhost-vsock and hands QEMU the fd; a macvtap: it opens
        # the macvtap's character device (/dev/tapN, major "macvtap"); host
        # devices: the hypervisor opens their VFIO or USB nodes. Merges with
        # the template's DeviceAllow=; the principal itself needs no access
        # to the first two.
        // lib.optionalAttrs (deviceAllow vm != [] || vm.devices != []) {
          DeviceAllow = deviceAllow vm ++ devicesAllow vm;
        }
        # A reboot inside the guest: QEMU and cloud-hypervisor reset the
        # machine in place; firecracker ends with status 0 (as after `vmwarden
        # stop`'s Ctrl-Alt-Del, which its guest answers with a reboot), and
        # the unit starts it again after such an exit of its own; a stop
        # through systemd is never restarted. A guest poweroff halts a
        # firecracker guest, and firecracker, which has no ACPI power-off,
        # runs on (docs/design/systemd-units.md).
        // lib.optionalAttrs (vm.hypervisor == "firecracker") {
          RestartForceExitStatus = "0";
        }
        # cloud-hypervisor with a virtiofs share cannot reboot in place (its
        # virtiofsd serves one connection): the launcher's reboot-watch ends
        # it with SIGHUP, a clean exit, which the unit starts again.
        // lib.optionalAttrs (vm.hypervisor == "cloud-hypervisor" && usesVirtiofsd vm) {
          RestartForceExitStatus = "SIGHUP";
        }
        // userNetworkDropin vm
        // ownedShareDropin vm
        // devicesDropin vm
        # Every part's RestrictNamespaces=, each its own line (`//` above
        # keeps only the last part's).
        // namespacesOf [(netNamespaceDropin vm) (userNetworkDropin vm) (ownedShareDropin vm)];
    };

  # Firecracker's taps live in a network namespace of its own, which the
  # launcher makes; a multi-queue tap is made in one of the launcher's own
  # and moved into the host's once it refuses every other user
  # (host::net::apart). Merges with the template's "mnt ipc".
  tapMadeApart = i: i.type != "macvtap" && i.queues != null && i.queues > 1;
  netNamespaceDropin = vm:
    lib.optionalAttrs (vm.interfaces != [] && (vm.hypervisor == "firecracker" || lib.any tapMadeApart vm.interfaces)) {
      RestrictNamespaces = "net";
    };
  namespacesOf = parts: let
    all = lib.concatMap (p: lib.toList (p.RestrictNamespaces or [])) parts;
  in
    lib.optionalAttrs (all != []) {RestrictNamespaces = all;};

  # User networking: passt runs in the unit's cgroup and under its
  # seccomp filters. It is the guest's network, so it opens IPv4 and IPv6
  # sockets and reads routes over NETLINK_ROUTE (RestrictAddressFamilies=
  # merges with the template's AF_UNIX; AF_NETLINK covers taps too), its
  # sockets need IP traffic the template's IPAddressDeny=any refuses
  # (IPAddressAllow=any wins over it; loopback included, which the gateway
  # reaches), and its own sandbox is a user namespace with mount, IPC, UTS
  # and PID namespaces in it (RestrictNamespaces= merges with the
  # template's "mnt ipc"). The launcher's own seccomp filter still keeps the
  # hypervisor to AF_UNIX and no namespaces, and passt off network, cgroup
  # and time namespaces (docs/networking.md); launcher/src/unit.rs renders
  # the same drop-in.
  # Devices: the launcher (root, before its drop) rebinds each PCI device
  # through sysfs, read-only under ProtectKernelTunables= but for these
  # trees; the hypervisor opens the VFIO nodes or the USB node; VFIO pins
  # the guest's RAM (the launcher sets the same limit). launcher/src/unit.rs
  # renders the same lines.
  usesPci = vm: builtins.any (d: d.bus == "pci") vm.devices;
  devicesAllow = vm:
    lib.optionals (usesPci vm) ["/dev/vfio/vfio rw" "char-vfio rw"]
    ++ lib.optional (builtins.any (d: d.bus == "usb") vm.devices) "char-usb_device rw";
  devicesDropin = vm:
    lib.optionalAttrs (usesPci vm) {
      LimitMEMLOCK = toString ((vm.memoryMiB + 1024) * 1024 * 1024);
    }
    # libusb's hotplug monitor (a uevent socket), without which QEMU's
    # usb-host does not start; taps and user networking already add it.
    // lib.optionalAttrs (builtins.any (d: d.bus == "usb") vm.devices && vm.interfaces == [] && !vm.userNetwork.enable) {
      RestrictAddressFamilies = "AF_NETLINK";
    };

  userNetworkDropin = vm:
    lib.optionalAttrs vm.userNetwork.enable {
      IPAddressAllow = "any";
      RestrictAddressFamilies = "AF_INET AF_INET6 AF_NETLINK";
      RestrictNamespaces = "user uts pid";
    };

  # A writable virtiofs share, which the guest owns: its virtiofsd unshares
  # a user namespace of its own, and its broker reads the virtiofsd's memory
  # and fds and makes directories set-group-ID (launch/helpers/owned.rs,
  # broker.rs). The launcher's own filters confine both and every other
  # process of the VM as before; these merge with the template's
  # (`owned_share_entries` in launcher/src/unit.rs).
  ownedShareDropin = vm:
    lib.optionalAttrs (lib.any (s: s.proto == "virtiofs" && !s.readOnly) vm.shares) (
      # A VM with user networking has "user" already, with passt's others.
      lib.optionalAttrs (!vm.userNetwork.enable) {RestrictNamespaces = "user";}
      // {
        RestrictSUIDSGID = false;
        SystemCallFilter = "process_vm_readv pidfd_getfd";
      }
    );

  # ReadWritePaths=: writable disks, writable share sources (virtiofsd and
  # QEMU's 9p write there as the principal) and landlock.write; and each
  # writable source's parent (but /), where the launcher makes a missing
  # source when that parent is root's alone (launch/share_sources.rs).
  writablePaths = vm:
    map (d: d.path) (filter (d: !d.readOnly) vm.disks)
    ++ vm.landlock.write
    ++ map (s: s.source) (filter (s: !s.readOnly) vm.shares)
    ++ filter (p: p != "/") (map (s: dirOf s.source) (filter (s: !s.readOnly) vm.shares));

  # The target (microvms.target by default): the autostart VMs (wants) come
  # from the module.
  target = names: fromUnitData names.subst "microvms.target.toml";

  # Boot-time dry run of `vmwarden reap`: what a previous boot left behind,
  # in the journal; deletes nothing.
  # Once per boot (RemainAfterExit in the data): a switch that changes the
  # unit (a vmwarden update) must not stop and start, that is re-run, it
  # either. NixOS-only (X-RestartIfChanged=false, read by switch).
  reapReport = names: bin:
    fromUnitData ({"@bin@" = bin;} // names.subst) "vmwarden-reap-report.service.toml"
    // nixosServiceDefaults
    // {restartIfChanged = false;};

  # vmwarden-hibernate-on-shutdown.service (vmwarden.hibernateOnShutdown):
  # the same data `render-unit --hibernate-on-shutdown` reads, with the
  # deadline per VM; stopped before every declared VM (`vmNames`), not only
  # the target's, so VMs started by hand are put down too. A switch that
  # changes it must not stop it: its stop hibernates every VM
  # (X-RestartIfChanged=false; X-StopOnRemoval=false is in the data).
  hibernateOnShutdown = names: bin: timeout: vmNames: let
    unit = fromUnitData ({"@bin@" = bin;} // names.subst // {"@timeout@" = toString timeout;}) "vmwarden-hibernate-on-shutdown.service.toml";
  in
    unit
    // nixosServiceDefaults
    // {
      after = unit.after ++ map names.instance vmNames;
      restartIfChanged = false;
    };

  # vmwarden-metrics.service and .timer (vmwarden.metrics.textfile): the
  # same data `render-unit --metrics-service`/`--metrics-timer` reads, with
  # the textfile directory and the interval for @textfile@ and @interval@.
  metricsUnits = names: bin: textfile: let
    subst = {
      "@bin@" = bin;
      "@textfile@" = textfile.directory;
      "@interval@" = textfile.interval;
    };
  in {
    service = fromUnitData (subst // names.subst) "vmwarden-metrics.service.toml" // nixosServiceDefaults;
    timer = fromUnitData (subst // names.subst) "vmwarden-metrics.timer.toml";
  };

  # node-exporter's textfile directory when its flags name one
  # (services.prometheus.exporters.node.extraFlags), else null.
  nodeExporterTextfileDir = config: let
    flags = config.services.prometheus.exporters.node.extraFlags or [];
    dirs = lib.concatMap (f: let
      m = builtins.match "--collector[.]textfile[.]directory[= ]([^ ]+)" f;
    in
      if m == null
      then []
      else m)
    flags;
  in
    if dirs == []
    then null
    else lib.last dirs;

  # Activation snippet (every boot and every switch, after switch has
  # stopped the VMs it stops): lists the state and runtime directories of
  # VMs that are no longer configured, with the command that deletes them.
  # Reads directory names only; changes nothing.
  removedReport = names: ''
    vmwarden_state=${stateRoot} vmwarden_run=${runtimeRoot}
    for d in "$vmwarden_state"/* "$vmwarden_run"/*; do
      [ -d "$d" ] && [ ! -L "$d" ] || continue
      n=''${d##*/}
      case " ${toString names} " in *" $n "*) continue ;; esac
      case $n in [a-z]*) ;; *) continue ;; esac
      if [ "$d" = "$vmwarden_state/$n" ]; then
        echo "vmwarden: VM $n is no longer configured; its state is in $d: 'vmwarden purge $n' deletes it (after a backup of what you want to keep)"
      else
        echo "vmwarden: VM $n is no longer configured; 'vmwarden reap --apply' removes $d"
      fi
    done
  '';

  # ---------------------------------------------------------------- misc
  # microvm.nix's host module (nixosModules.host) defines microvm@.service
  # and microvms.target: the names of vmwarden's default prefix.
  microvmNixHost = options: config:
    lib.hasAttrByPath ["microvm" "host" "enable"] options
    && (config.microvm.host.enable or false);
  # The VM names microvm.nix's host module declares (microvm.vms), when it
  # is on.
  microvmNixVms = options: config:
    if microvmNixHost options config
    then builtins.attrNames (config.microvm.vms or {})
    else [];
  # Whether vmwarden's units would take names microvm.nix's host module
  # defines.
  sharesMicrovmNixNames = names: names.template == "microvm@.service" || names.target == "microvms.target";

  duplicates = xs: lib.unique (filter (x: lib.count (y: y == x) xs > 1) xs);
}
