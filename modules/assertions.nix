# Configuration errors caught at evaluation time, each with a message that
# says what to change. The launcher checks the same rules again at start.
{
  config,
  lib,
  options,
  pkgs,
  ...
}: let
  inherit (lib) concatLists concatStringsSep filter hasPrefix mapAttrsToList mkIf stringLength;
  vlib = import ./lib.nix {inherit lib;};
  guestLib = import ./microvm-guest.nix {inherit lib;};
  cfg = config.vmwarden;
  vms = mapAttrsToList (name: vm: vm // {inherit name;}) cfg.vms;

  microvmNixHost = vlib.microvmNixHost options config;
  unitNames = vlib.unitNames cfg.unitPrefix;
  microvmNixVms = vlib.microvmNixVms options config;

  kernelVersion = config.boot.kernelPackages.kernel.version or null;
  hostArch = pkgs.stdenv.hostPlatform.qemuArch or "x86_64";
  names = map (vm: vm.name) vms;

  perVm = vm: let
    # What the hypervisor cannot put into a snapshot (config/hibernate.rs
    # `blockers`, the same order).
    hibernateBlockers =
      lib.imap0 (i: sh: "shares[${toString i}] (tag \"${sh.tag}\") is ${sh.proto}, which ${
        if vm.hypervisor == "qemu"
        then "QEMU cannot migrate"
        else "${vm.hypervisor} cannot snapshot"
      }")
      vm.shares
      ++ lib.optional (vm.vsock.cid != null && vm.vsock.backend == "user") "vsock.backend = \"user\" cannot be put into a snapshot"
      ++ lib.optional (vm.hugepageMem && vm.hypervisor != "qemu") "hugepageMem: ${vm.hypervisor} restores no hugepage-backed memory"
      ++ lib.imap0 (i: _: "devices[${toString i}] is passed through, whose state no hypervisor can snapshot") vm.devices;
    inherit (vm) name;
    p = vm.principal;
    at = "vmwarden.vms.${name}";
    resourceChecks = [
      {
        assertion = vm.resources.memoryHighMiB == null || vm.resources.memoryMaxMiB == null || vm.resources.memoryHighMiB <= vm.resources.memoryMaxMiB;
        message = "${at}.resources.memoryHighMiB = ${toString vm.resources.memoryHighMiB} is above memoryMaxMiB = ${toString vm.resources.memoryMaxMiB}, so it would never apply: lower it or raise memoryMaxMiB.";
      }
    ];
    credChecks = concatLists (mapAttrsToList (c: src: [
        {
          assertion = vlib.validCredName c;
          message = "${at}.credentials.\"${c}\": credential names must match ^${vlib.credNameRegex}$ (a letter or digit, then letters, digits, '_', '.', '-'); rename it.";
        }
        {
          assertion = stringLength (vlib.fwCfgName c) <= vlib.fwCfgMax;
          message = "${at}.credentials.\"${c}\": the fw_cfg name \"${vlib.fwCfgName c}\" is ${toString (stringLength (vlib.fwCfgName c))} bytes; QEMU allows ${toString vlib.fwCfgMax}. Shorten the credential name to at most ${toString (vlib.fwCfgMax - stringLength vlib.fwCfgPrefix)} bytes.";
        }
        {
          assertion = !hasPrefix "${builtins.storeDir}/" src;
          message = "${at}.credentials.\"${c}\" = \"${src}\" is in the Nix store, which every local user can read. Keep the secret outside the store (e.g. sops-nix's or agenix's /run/secrets path) and give its path as a string.";
        }
      ])
      vm.credentials);
    pathChecks = concatLists (map (e: let
        d = vlib.hiddenDirOf e.path;
        other = lib.findFirst (n: n != name && vlib.isUnder (vlib.stateDirOf n) e.path) null names;
      in [
        {
          assertion = d == null;
          message = "${e.option}: ${e.path} is under ${toString d}, which microvm@.service hides (ProtectHome=yes, PrivateTmp=yes); move it, e.g. under /var/lib/vmwarden/${name}/.";
        }
        {
          assertion = other == null;
          message = "${e.option}: ${e.path} is in VM ${toString other}'s state directory, which this VM's sandbox cannot see and must not use; give each VM its own files.";
        }
        {
          assertion = !vlib.isUnder vlib.runtimeRoot e.path;
          message = "${e.option}: ${e.path} is under ${vlib.runtimeRoot}, which belongs to vmwarden (leases, intent records, control sockets, credentials); keep VM files under ${vlib.stateDirOf name}/ or elsewhere.";
        }
      ])
      (vlib.vmPaths name vm));

    # Shares.
    shareChecks =
      concatLists (lib.imap0 (i: sh: let
          here = "${at}.shares[${toString i}] (tag \"${sh.tag}\")";
        in [
          {
            assertion = vlib.validShareTag sh.tag;
            message = "${here}: a tag is 1 to ${toString vlib.shareTagMax} bytes of ${vlib.shareTagRegex} (the guest mounts it by this name, QEMU's 9p keeps ${toString vlib.shareTagMax} bytes, and ',' or '=' would split QEMU's argument); shorten or rename it, and the guest's mount with it.";
          }
          {
            assertion = sh.readOnly || !vlib.isUnder builtins.storeDir sh.source;
            message = "${here}: ${sh.source} is in the Nix store, which is shared read-only only; set readOnly = true.";
          }
          {
            assertion = !(vm.hypervisor == "cloud-hypervisor" && sh.proto == "9p");
            message = "${here}: cloud-hypervisor has no 9p; use proto = \"virtiofs\" (and mount it as virtiofs in the guest), or hypervisor = \"qemu\".";
          }
        ])
        vm.shares)
      ++ map (t: {
        assertion = false;
        message = "${at}.shares: tag \"${t}\" appears twice; every share needs its own tag.";
      }) (vlib.duplicates (map (sh: sh.tag) vm.shares))
      ++ [
        {
          assertion = vm.hypervisor != "firecracker" || vm.shares == [];
          message = "${at}.shares: firecracker has no shared file systems; use hypervisor = \"qemu\" or \"cloud-hypervisor\", or a disk image.";
        }
      ];

    # Guest memory (config/memory.rs refuses the same at launch).
    memoryChecks = [
      # config/hibernate.rs (`blockers`) refuses the same at launch: what
      # the hypervisor cannot snapshot.
      {
        assertion = !(vm.hibernate.allowed && hibernateBlockers != []);
        message = "${at}.hibernate.allowed: ${lib.head hibernateBlockers}; set hibernate.allowed = false, or remove it.";
      }
      {
        assertion = !(vm.hypervisor == "firecracker" && vm.memMerge);
        message = "${at}.memMerge: firecracker never marks guest memory mergeable (it has no KSM option); set memMerge = false, or use hypervisor = \"qemu\" or \"cloud-hypervisor\".";
      }
      {
        assertion = !(vm.hypervisor == "cloud-hypervisor" && vm.memMerge && builtins.any (s: s.proto == "virtiofs") vm.shares);
        message = "${at}.memMerge: cloud-hypervisor cannot merge memory it shares with virtiofsd (its mergeable and shared exclude each other); drop the virtiofs shares or set memMerge = false.";
      }
      {
        assertion = !vm.hugepageMem || lib.mod vm.memoryMiB 2 == 0;
        message = "${at}.memoryMiB = ${toString vm.memoryMiB}: hugepageMem backs the guest with 2 MiB pages; give an even memoryMiB.";
      }
    ];

    # The host's own tools: balloon, console (capabilities.rs refuses the
    # same for firecracker, and the balloon's size, at launch).
    toolChecks = [
      {
        assertion = !(vm.hypervisor == "firecracker" && vm.balloon);
        message = "${at}.balloon: vmwarden drives no firecracker balloon; use hypervisor = \"qemu\" or \"cloud-hypervisor\", or set balloon = false.";
      }
      {
        assertion = !(vm.hypervisor == "firecracker" && vm.console);
        message = "${at}.console: firecracker's serial console is only its own stdin and stdout, which the journal holds; read it with journalctl, or use hypervisor = \"qemu\" or \"cloud-hypervisor\".";
      }
      {
        assertion = vm.initialBalloonMem == 0 || vm.balloon;
        message = "${at}.initialBalloonMem: it sizes the balloon, which needs balloon = true.";
      }
      {
        assertion = vm.initialBalloonMem + 16 <= vm.memoryMiB;
        message = "${at}.initialBalloonMem = ${toString vm.initialBalloonMem}: the guest must keep at least 16 MiB of its memoryMiB ${toString vm.memoryMiB}; at most ${toString (vm.memoryMiB - 16)}.";
      }
    ];

    # Disks: format, serial, create.
    diskChecks = concatLists (lib.imap0 (i: d: let
        here = "${at}.disks[${toString i}] (${d.path})";
        own = vlib.stateDirOf name;
      in [
        {
          assertion = d.create == null || (vlib.isUnder own d.path && d.path != own);
          message = "${here}: create makes images inside the VM's own state directory only (${own}/); move the path there, or create the image yourself, owned by vm-${name}, mode 0600, and drop create.";
        }
        {
          assertion = d.create == null || d.format != "qcow2";
          message = "${here}: create makes a raw image; drop format = \"qcow2\", or create the qcow2 image yourself and drop create.";
        }
        {
          assertion = d.serial == null || vlib.validSerial d.serial;
          message = "${here}: serial \"${toString d.serial}\" must be 1 to 20 bytes of ${vlib.serialRegex} (virtio-blk keeps 20 bytes, and ',' would split QEMU's -drive argument).";
        }
        {
          assertion = vm.hypervisor != "firecracker" || d.serial == null;
          message = "${here}: firecracker's drives have no serial; drop serial (have the guest find the disk by its order or a label) or use hypervisor = \"qemu\".";
        }
        {
          assertion = vm.hypervisor != "firecracker" || d.format != "qcow2";
          message = "${here}: firecracker takes raw images only; convert it (qemu-img convert -O raw) or use hypervisor = \"qemu\".";
        }
      ])
      vm.disks);

    # vsock, extraArgs, machine.
    cid = vm.vsock.cid;
    binArch = vlib.qemuBinaryArch hostArch vm.hypervisorBinary;
    otherChecks =
      [
        {
          assertion = cid == null || vlib.validCid cid;
          message = "${at}.vsock.cid = ${toString cid}: CIDs 0, 1 and 2 are the hypervisor, loopback and the host, and ${toString (vlib.vsockCidMax + 1)} means any; pick one from ${toString vlib.vsockCidMin} to ${toString vlib.vsockCidMax}.";
        }
        {
          assertion = cid == null || vm.hypervisor == "qemu" || vm.vsock.backend == "user";
          message = "${at}.vsock.backend = \"vhost\": ${vm.hypervisor} serves vsock itself on a unix socket in control/; set backend = \"user\".";
        }
        {
          assertion = vm.hypervisor != "qemu" || vlib.machineArch.${vm.machine} == binArch;
          message = "${at}.machine = \"${vm.machine}\" is a machine of qemu-system-${vlib.machineArch.${vm.machine}}, but this VM runs qemu-system-${binArch}; use ${concatStringsSep " or " (map (m: "\"${m}\"") (builtins.attrNames (lib.filterAttrs (_: a: a == binArch) vlib.machineArch)))}.";
        }
        {
          assertion = builtins.stringLength vm.cmdline <= 4096 && builtins.match "[^[:cntrl:]]*" vm.cmdline != null;
          message = "${at}.cmdline: the kernel command line is at most 4096 bytes without control characters (it is ${toString (builtins.stringLength vm.cmdline)} bytes).";
        }
        # the guest's notify socket (config/vmm_notify.rs)
        {
          assertion = vm.vsock.notify != true || vm.hypervisor == "firecracker";
          message = "${at}.vsock.notify = true: ${vm.hypervisor} needs no notify socket, a poweroff inside its guest ends it through ACPI; only firecracker gets one. Remove it.";
        }
        {
          assertion = vm.vsock.notify != true || cid != null;
          message = "${at}.vsock.notify = true: the notify socket is a vsock port; give the VM a vsock.cid, or remove it.";
        }
        {
          assertion = vm.vsock.notifyPort == null || vlib.usesVmmNotify vm;
          message = "${at}.vsock.notifyPort is set, but the VM has no notify socket (it needs hypervisor = \"firecracker\", a vsock.cid and vsock.notify not false); remove it.";
        }
        {
          assertion = !(vlib.usesVmmNotify vm) || builtins.match ".*systemd[.]set_credential(_binary)?=\"?vmm[.]notify_socket:.*" vm.cmdline == null;
          message = "${at}.cmdline sets the vmm.notify_socket credential itself, which vsock.notify (on by default for firecracker with a vsock.cid) sets to the host's listener; remove it from cmdline, or set vsock.notify = false.";
        }
        {
          assertion = !(vlib.usesVmmNotify vm) || builtins.stringLength vm.cmdline + 1 + builtins.stringLength (vlib.vmmNotifyParam vm) <= 4096;
          message = "${at}.cmdline: with vsock.notify's `${vlib.vmmNotifyParam vm}` the guest's command line would be over 4096 bytes; shorten it, or set vsock.notify = false.";
        }
      ]
      ++ map (why: {
        assertion = false;
        message = "${at}.extraArgs: ${why}.";
      }) (vlib.extraArgsProblems vm.hypervisor name vm.extraArgs);

    # User networking (passt): the launcher's checks of user_network, and
    # what depends on this host: a forwarded port passt, as the principal,
    # may bind (boot.kernel.sysctl's net.ipv4.ip_unprivileged_port_start;
    # the launcher checks the running value again), and user namespaces,
    # which passt's own sandbox is made of.
    un = vm.userNetwork;
    unAt = "${at}.userNetwork";
    fromGuest = lib.optionalString (vm.guest != null) " (the guest's microvm.forwardPorts)";
    portStart = let
      v = lib.attrByPath ["boot" "kernel" "sysctl" "net.ipv4.ip_unprivileged_port_start"] null config;
    in
      if v == null
      then vlib.userNet.unprivileged_port_start
      else if builtins.isInt v
      then v
      else lib.toInt (toString v);
    userNetChecks = lib.optionals un.enable (
      [
        {
          assertion = vm.hypervisor == "qemu";
          message = "${unAt}.enable: ${vm.hypervisor} has no user networking in vmwarden (passt serves a guest over QEMU's stream socket); use interfaces (a tap) or hypervisor = \"qemu\".";
        }
        {
          assertion = vlib.validUserNetId un.id;
          message = "${unAt}.id = \"${un.id}\": an id is a letter, then letters, digits, '-', '.' or '_', at most ${toString vlib.userNet.id_max} bytes (a QEMU netdev id), and not net0, net1, ... (the taps'); rename it.";
        }
        {
          assertion = un.mac == null || vlib.unicastMac un.mac;
          message = "${unAt}.mac = \"${toString un.mac}\" is not a unicast address (the first octet must be even, and not all zero).";
        }
        {
          assertion = config.security.allowUserNamespaces or true;
          message = "${unAt}.enable: passt's own sandbox is a user namespace, but security.allowUserNamespaces = false; allow them, or give the VM a tap instead.";
        }
      ]
      ++ map (m: {
        assertion = false;
        message = "${m}${fromGuest}.";
      }) (vlib.forwardPortProblems "${unAt}.forwardPorts" un.forwardPorts)
      ++ lib.imap0 (i: f: {
        assertion = f.from != "host" || f.host.port == 0 || f.host.port >= portStart;
        message = "${unAt}.forwardPorts[${toString i}].host.port = ${toString f.host.port}${fromGuest}: it is below net.ipv4.ip_unprivileged_port_start (${toString portStart}), and passt binds it as the VM's principal, without CAP_NET_BIND_SERVICE; use a port of ${toString portStart} or above, or lower boot.kernel.sysctl.\"net.ipv4.ip_unprivileged_port_start\".";
      })
      un.forwardPorts
    );

    # A microvm.nix guest: what vmwarden cannot honour, named after the
    # guest's option. Until that is fixed, the VM's other checks wait: the
    # refused values were left out of the VM, so they would only add noise.
    derived = guestLib.derive {
      inherit name;
      inherit (vm) guest tapBridges;
      hostSystem = pkgs.stdenv.hostPlatform.system or null;
    };
    guestProblems = lib.optionals (vm.guest != null) derived.problems;
    tapBridgeChecks = map (t: {
      assertion = vm.guest != null && builtins.elem t derived.tapIds;
      message =
        if vm.guest == null
        then "${at}.tapBridges.\"${t}\": tapBridges attaches a guest's type = \"tap\" interfaces; without a guest, set interfaces.*.bridge."
        else "${at}.tapBridges.\"${t}\": the guest has no interface of type \"tap\" with id \"${t}\" (its tap interfaces: ${concatStringsSep ", " derived.tapIds}); fix the name.";
    }) (builtins.attrNames vm.tapBridges);
  in
    if !vlib.validVmName name
    then [
      {
        assertion = false;
        message = "vmwarden.vms.\"${name}\": VM names must match ^${vlib.vmNameRegex}$ (a lowercase letter, then at most 31 lowercase letters, digits or '-'); rename the attribute.";
      }
    ]
    else if guestProblems != []
    then
      map (p: {
        assertion = false;
        message = "${at}.guest: ${p}.";
      })
      guestProblems
    else
      tapBridgeChecks
      ++ [
        {
          assertion = vm.hypervisor != "firecracker" || vm.credentials == {};
          message = "${at}.credentials: firecracker cannot receive credentials safely (it has no fw_cfg and no SMBIOS, and systemd imports initrd credentials only as encrypted ones); use hypervisor = \"qemu\" or \"cloud-hypervisor\", or deliver the secret another way.";
        }
        {
          assertion = vm.hypervisor == "qemu" || vm.accel == "kvm";
          message = "${at}.accel = \"${vm.accel}\": ${vm.hypervisor} runs only on KVM; set accel = \"kvm\" or use hypervisor = \"qemu\".";
        }
        {
          assertion = vlib.validPrincipalName p.user;
          message = "${at}.principal.user = \"${p.user}\" is not a valid user name (^${vlib.principalNameRegex}$: at most 31 bytes, NixOS aborts on longer ones); set ${at}.principal.user to a shorter name.";
        }
        {
          assertion = vlib.validPrincipalName p.group;
          message = "${at}.principal.group = \"${p.group}\" is not a valid group name (^${vlib.principalNameRegex}$: at most 31 bytes, NixOS aborts on longer ones); set ${at}.principal.group to a shorter name.";
        }
        {
          assertion = !builtins.elem p.user ["root" "nobody"];
          message = "${at}.principal.user = \"${p.user}\": a VM must run as its own unprivileged user; pick a new name such as \"vm-${name}\".";
        }
        {
          assertion = !builtins.elem p.group vlib.privilegedGroups;
          message = "${at}.principal.group = \"${p.group}\" is a privileged group (${concatStringsSep ", " vlib.privilegedGroups}); use the VM's own group, e.g. \"vm-${name}\".";
        }
        {
          assertion = !builtins.elem p.group vlib.sharedGroups;
          message = "${at}.principal.group = \"${p.group}\" is shared with others (every VM's hypervisor gets /dev/kvm's group; nogroup is nobody's), and a VM's files are group-owned by it; use the VM's own group, e.g. \"vm-${name}\".";
        }
        {
          assertion = p.uid != 65534;
          message = "${at}.principal.uid = 65534 is the overflow uid (nobody); pick another uid or leave it null.";
        }
      ]
      ++ credChecks
      ++ resourceChecks
      ++ userNetChecks
      ++ pathChecks
      ++ shareChecks
      ++ memoryChecks
      ++ toolChecks
      ++ diskChecks
      ++ otherChecks
      ++ map (i: {
        assertion = vlib.validBridgeName i.bridge;
        message = "${at}.interfaces: bridge \"${i.bridge}\" of ${i.tap} is not a bridge the launcher accepts (not \".\" or \"..\", not starting with ${vlib.tapPrefix}, which marks vmwarden's taps).";
      }) (filter (i: i.bridge != null) vm.interfaces)
      ++ map (i: {
        assertion = vlib.unicastMac i.mac;
        message = "${at}.interfaces: mac \"${i.mac}\" of ${i.tap} is not a unicast address (the first octet must be even, and not all zero).";
      }) (filter (i: i.mac != null) vm.interfaces)
      ++ map (t: {
        assertion = false;
        message = "${at}.interfaces: tap \"${t}\" appears twice.";
      }) (vlib.duplicates (map (i: i.tap) vm.interfaces))
      ++ concatLists (map (i: let
        on = "${at}.interfaces: macvtap \"${i.tap}\"";
      in [
        {
          assertion = i.macvtap.link != null && i.macvtap.mode != null;
          message = "${on} needs macvtap.link (the host interface it sits on, e.g. \"enp3s0\") and macvtap.mode (e.g. \"bridge\"); set both.";
        }
        {
          assertion = i.macvtap.link == null || vlib.validBridgeName i.macvtap.link;
          message = "${on}: macvtap.link \"${toString i.macvtap.link}\" is a VM's link (${vlib.tapPrefix}*) or not a usable name; name a host interface (a NIC, a bond, a VLAN or a bridge).";
        }
        {
          assertion = i.bridge == null;
          message = "${on} sits on its macvtap.link, never on a bridge; remove bridge = \"${toString i.bridge}\" (or use type = \"tap\").";
        }
        {
          assertion = vm.hypervisor != "firecracker";
          message = "${on}: firecracker opens its network devices by name and cannot take a macvtap's queues as file descriptors; use type = \"tap\" on a bridge, or hypervisor = \"qemu\" or \"cloud-hypervisor\".";
        }
      ]) (filter (i: i.type == "macvtap") vm.interfaces));

  # uid -> owners, over VMs and every other user with a fixed uid.
  vmUsers = map (vm: vm.principal.user) vms;
  fixedUids =
    filter (u: u.uid != null)
    (mapAttrsToList (n: u: {
        name = n;
        inherit (u) uid;
      })
      config.users.users);
  ownersOf = uid: map (u: u.name) (filter (u: u.uid == uid) fixedUids);
  vmUids = lib.unique (filter (x: x != null) (map (vm: vm.principal.uid) vms));
  # A QEMU guest whose sshd listens on vsock (microvm.vsock.ssh.enable) on
  # a backend that `ssh vsock/<cid>` cannot reach: the host chose "user".
  # Not refused (the host may mean it), but said, with what reaches it.
  # And a read-only share the guest mounts without nosuid,nodev.
  vsockSshWarnings = concatLists (map (vm: let
    derived = guestLib.derive {
      inherit (vm) name guest tapBridges;
      hostSystem = pkgs.stdenv.hostPlatform.system or null;
    };
  in
    lib.optionals (vm.guest != null && vlib.validVmName vm.name && derived.problems == []) derived.shareWarnings
    ++ lib.optional (vm.guest != null && vlib.validVmName vm.name && derived.problems == [] && derived.sshOverVsock && vm.vsock.backend != "vhost")
    "vmwarden.vms.${vm.name}.vsock.backend = \"${vm.vsock.backend}\": the guest enables microvm.vsock.ssh, but `ssh vsock/${toString vm.vsock.cid}` reaches only a guest on the kernel's vhost-vsock (backend = \"vhost\", what such a guest gets unless the host sets another). With \"user\" its sshd is reached as root through the hybrid vsock socket: `ssh vsock-mux${vlib.controlDirOf vm.name}/vsock.sock` (systemd-ssh-proxy, docs/microvm-nix.md). Remove the host's vsock.backend, or microvm.vsock.ssh.enable from the guest.")
  vms);
in {
  config = mkIf cfg.enable {
    warnings =
      vsockSshWarnings
      # The shutdown's hibernation with no VM that allows it does nothing.
      ++ lib.optional (cfg.hibernateOnShutdown.enable && !(lib.any (vm: vm.hibernate.allowed) vms))
      "vmwarden.hibernateOnShutdown.enable is set, but no VM has hibernate.allowed = true: every VM stops normally at shutdown. Set vmwarden.vms.<name>.hibernate.allowed = true on the VMs to put down to disk.";
    assertions =
      concatLists (map perVm vms)
      ++ map (uid: {
        assertion = builtins.length (ownersOf uid) <= 1;
        message = "vmwarden: uid ${toString uid} is used by several users (${concatStringsSep ", " (ownersOf uid)}); every VM principal needs its own uid: change vmwarden.vms.<name>.principal.uid.";
      })
      vmUids
      ++ map (u: {
        assertion = false;
        message = "vmwarden: principal.user \"${u}\" is shared by several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: vm.principal.user == u) vms))}); give each VM its own user.";
      }) (vlib.duplicates vmUsers)
      ++ map (c: {
        assertion = false;
        message = "vmwarden: vsock CID ${toString c} is used by several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: vm.vsock.cid == c) vms))}); every VM needs its own vmwarden.vms.<name>.vsock.cid.";
      }) (vlib.duplicates (filter (c: c != null) (map (vm: vm.vsock.cid) vms)))
      ++ map (t: {
        assertion = false;
        message = "vmwarden: tap \"${t}\" is used by several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: builtins.any (i: i.tap == t) vm.interfaces) vms))}); tap names must be unique.";
      }) (vlib.duplicates (concatLists (map (vm: lib.unique (map (i: i.tap) vm.interfaces)) vms)))
      # One device, one VM (the launcher refuses a device another running VM
      # holds, whatever the configuration says).
      ++ map (p: {
        assertion = false;
        message = "vmwarden: device ${p} is in the devices of several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: builtins.any (d: "${d.bus} ${d.path}" == p) vm.devices) vms))}); a device is one VM's for its life: give it to one of them.";
      }) (vlib.duplicates (concatLists (map (vm: lib.unique (map (d: "${d.bus} ${d.path}") vm.devices)) vms)))
      ++ [
        {
          assertion = kernelVersion == null || !lib.versionOlder kernelVersion vlib.minKernel;
          message = "vmwarden needs Linux >= ${vlib.minKernel} (tmpfs `noswap` for the credential tmpfs), but boot.kernelPackages has ${toString kernelVersion}; set boot.kernelPackages = pkgs.linuxPackages_6_12 (or newer, e.g. pkgs.linuxPackages_latest).";
        }
        {
          assertion = !(microvmNixHost && vlib.sharesMicrovmNixNames unitNames);
          message = "vmwarden (vmwarden.unitPrefix = \"${cfg.unitPrefix}\") and microvm.nix's host module both define ${unitNames.template} and ${unitNames.target}; set vmwarden.unitPrefix = \"vmwarden\" to run both (vmwarden@.service, vmwarden-vms.target), or remove microvm.nixosModules.host from this host's imports (or set microvm.host.enable = false).";
        }
        {
          assertion = !(cfg.metrics.textfile.enable && cfg.metrics.textfile.directory == null);
          message = "vmwarden.metrics.textfile.enable is set, but no textfile directory is known: set vmwarden.metrics.textfile.directory to node-exporter's textfile collector directory, or give node-exporter one with services.prometheus.exporters.node.extraFlags = [\"--collector.textfile.directory=/var/lib/prometheus-node-exporter-text-files\"].";
        }
      ]
      ++ map (n: {
        assertion = false;
        message = "vmwarden: VM \"${n}\" is claimed by both vmwarden.vms.${n} and microvm.nix's microvm.vms.${n}; a VM runs under one of them: remove it from microvm.vms once `vmwarden adopt ${n}` has moved its state (docs/microvm-nix.md, \"Migrating\"), or rename one of them.";
      }) (filter (n: builtins.elem n microvmNixVms) names);
  };
}
