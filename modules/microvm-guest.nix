# How an evaluated microvm.nix guest (its `config.microvm`, built by
# microvm.nix's guest module) becomes the options of a vmwarden VM, and
# which of its settings vmwarden cannot honour. Pure: no `config` is read;
# options.nix defines the values with lib.mkDefault (a plain definition on
# the host wins), assertions.nix turns the problems into failed assertions.
# The formulas are microvm.nix's own (lib/runner.nix, lib/runners/*.nix);
# docs/microvm-nix.md has the table of every option and the
# derivation ("How a guest is derived"), with the microvm.nix version they were read from.
{lib}: let
  inherit (lib) concatLists elem filter hasInfix hasPrefix optional optionalAttrs;
  vlib = import ./lib.nix {inherit lib;};

  supportedHypervisors = ["qemu" "cloud-hypervisor" "firecracker"];
  # binScripts microvm.nix's guest module defines itself (replaced by the
  # launcher's own taps and macvtaps, virtiofsd; PCI is refused elsewhere).
  ownBinScripts = ["tap-up" "tap-down" "macvtap-up" "macvtap-down" "virtiofsd-run" "pci-setup"];
  uuidRegex = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";

  # A value as a message shows it.
  show = v: let
    s =
      if builtins.isAttrs v
      then "{ ... }"
      else builtins.toJSON v;
  in
    if builtins.stringLength s > 100
    then "${builtins.substring 0 97 s}..."
    else s;

  join = parts: lib.concatStringsSep " " (filter (p: p != "") parts);
  diskPathOk = p: vlib.isNormalAbsolutePath p && !hasInfix "," p;
in rec {
  inherit supportedHypervisors;

  # derive { name; guest; hostSystem; tapBridges; } ->
  #   { values;    vmwarden.vms.<name> option values (only valid ones)
  #     problems;  messages for what vmwarden cannot honour, each naming
  #                the guest option and what to do
  #     tapIds;    the guest's tap interfaces, for tapBridges
  #     sshOverVsock;  a QEMU guest whose sshd listens on vsock
  #                (microvm.vsock.ssh.enable): it needs the "vhost" backend
  #     shareWarnings; }  read-only shares the guest mounts without
  #                nosuid,nodev, each a warning saying how to add them
  # `hostSystem` is the host's "x86_64-linux"-style system, or null.
  derive = {
    name,
    guest,
    hostSystem ? null,
    tapBridges ? {},
  }: let
    hasMicrovm = guest != null && (guest.config.microvm or null) != null;
    g = guest.config.microvm;
    # Whether the guest sets an option itself (1500: only the default).
    setByGuest = path: (lib.attrByPath (path ++ ["highestPrio"]) 1500 (guest.options.microvm or {})) < 1500;

    system =
      guest.pkgs.stdenv.hostPlatform.system
      or (
        if hostSystem != null
        then hostSystem
        else "x86_64-linux"
      );
    arch = builtins.head (lib.splitString "-" system);
    # lib/runner.nix
    linuxTarget =
      guest.pkgs.linux.target
      or guest.pkgs.stdenv.hostPlatform.linux-kernel.target
      or (
        if arch == "aarch64"
        then "Image"
        else "bzImage"
      );
    stateDir = vlib.stateDirOf name;
    # Relative images and share sources: against the VM's state directory,
    # as microvm.nix resolves them against /var/lib/microvms/<name>.
    abs = p:
      if hasPrefix "/" p
      then p
      else "${stateDir}/${p}";

    hv = g.hypervisor;
    qemu = hv == "qemu";
    ch = hv == "cloud-hypervisor";
    fc = hv == "firecracker";

    # One check: [message] when `bad`.
    refuse = bad: opt: value: why: optional bad "microvm.${opt} = ${show value}: ${why}";
    # A non-default value of an option vmwarden has no counterpart for.
    refuseSet = opt: default: why: refuse (lib.attrByPath (lib.splitString "." opt) default g != default) opt (lib.attrByPath (lib.splitString "." opt) default g) why;

    # ------------------------------------------------------------ top level
    topProblems =
      refuse (!elem hv supportedHypervisors) "hypervisor" hv "vmwarden runs qemu, cloud-hypervisor and firecracker only (their argv, control socket and stop sequence); use hypervisor = \"qemu\", \"cloud-hypervisor\" (virtiofs shares only) or \"firecracker\" (no shares, no credentials)"
      ++ optional (hostSystem != null && system != hostSystem) "the guest is built for ${system} (its pkgs.stdenv.hostPlatform.system), this host is ${toString hostSystem}: build the guest for the host's system (microvm.cpu emulation is not offered; for a foreign guest set kernel, initrd, cmdline, accel = \"tcg\" and a matching hypervisorBinary yourself)"
      ++ refuseSet "cpu" null "vmwarden picks -cpu from accel (host on KVM, max on TCG); remove it, and for emulation set vmwarden.vms.${name}.accel = \"tcg\" (a CPU model on QEMU: add [ \"-cpu\" \"<model>\" ] to vmwarden.vms.${name}.extraArgs)"
      ++ refuseSet "preStart" "" "it would run as root in the VM's unit before the sandbox exists; put the commands in a unit of your own ordered before microvm@${name}.service (Type = \"oneshot\", requiredBy and before it)"
      ++ refuseSet "extraArgsScript" null "arguments computed at start escape vmwarden's checks; use the static microvm.qemu.extraArgs (or vmwarden.vms.${name}.extraArgs)"
      ++ refuseSet "user" null "every vmwarden VM runs as its own principal; remove it and set vmwarden.vms.${name}.principal.user (default vm-${name}) on the host"
      ++ refuse (g.hugepageMem && lib.mod g.mem 2 != 0) "mem" g.mem "hugepageMem backs the guest with 2 MiB pages; give an even microvm.mem"
      ++ refuseSet "hotplugMem" 0 "virtio-mem (memory that grows) is not mapped by vmwarden; size microvm.mem for the most the guest may use, and take memory back with microvm.balloon = true (vmwarden balloon)"
      ++ refuseSet "hotpluggedMem" 0 "as hotplugMem: size microvm.mem for the guest instead"
      ++ refuse (fc && g.balloon) "balloon" true "vmwarden drives no firecracker balloon (microvm.nix has none either); use qemu or cloud-hypervisor, or size microvm.mem"
      ++ refuse (g.initialBalloonMem != 0 && !g.balloon) "initialBalloonMem" g.initialBalloonMem "it sizes the balloon, which needs microvm.balloon = true"
      ++ refuse (fc && g.devices != []) "devices" (map (d: d.path) g.devices) "firecracker has no PCI or USB passthrough; use qemu (PCI and USB) or cloud-hypervisor (PCI)"
      ++ concatLists (lib.imap0 (i: d:
        refuse (ch && d.bus == "usb") "devices.${toString i}.bus" d.bus "cloud-hypervisor has no USB controller (microvm.nix passes USB devices to QEMU only); use qemu"
        ++ refuse (!qemu
          && d.qemu
          != {
            id = null;
            bus = null;
            deviceExtraArgs = null;
          }) "devices.${toString i}.qemu"
        d.qemu "these are QEMU's device options; remove them")
      g.devices)
      ++ refuseSet "graphics.enable" false "a display needs a desktop session or GPU devices outside the sandbox; use the serial console (in the journal) and SSH"
      ++ (
        let
          extra = filter (s: !elem s ownBinScripts) (builtins.attrNames g.binScripts);
        in
          refuse (extra != []) "binScripts" extra "vmwarden never builds or runs microvm.nix's runner; put the script in a host unit of its own"
      )
      ++ refuse (g.vcpu > 255) "vcpu" g.vcpu "vmwarden allows 1 to 255 vCPUs"
      ++ refuse (g.mem < 16 || g.mem > 1048576) "mem" g.mem "vmwarden allows 16 to 1048576 MiB"
      ++ refuse (g.machineId != null && builtins.match uuidRegex g.machineId == null) "machineId" g.machineId "it becomes QEMU's -smbios uuid=; give a UUID (8-4-4-4-12 hex digits) or null";

    # ------------------------------------------------------------ hypervisors
    # No default outside x86_64-linux and aarch64-linux: undefined, a throw.
    machine = builtins.tryEval g.qemu.machine;
    machineOk = machine.success && elem machine.value (builtins.attrNames vlib.machineArch);
    chExtra = g.cloud-hypervisor.extraArgs;
    fcExtra = g.firecracker.extraArgs;
    smbios = optional (g.machineId != null) ["-smbios" "type=1,uuid=${g.machineId}"];
    extraArgs =
      if qemu
      then g.qemu.extraArgs ++ concatLists smbios
      else if ch
      then chExtra
      else fcExtra;
    extraOpt =
      if qemu
      then "qemu.extraArgs"
      else if ch
      then "cloud-hypervisor.extraArgs"
      else "firecracker.extraArgs";
    extraProblems = map (why: "microvm.${extraOpt}: ${why}") (vlib.extraArgsProblems hv name extraArgs);
    hvProblems =
      lib.optionals qemu (
        refuse (!machineOk) "qemu.machine" machine.value "vmwarden's argv knows the machines ${lib.concatStringsSep ", " (builtins.attrNames vlib.machineArch)}; use one of them"
        ++ refuseSet "qemu.machineOpts" null "vmwarden passes a plain -machine and its own -accel; remove it (mem-merge is vmwarden.vms.${name}.memMerge; one essential property can go into vmwarden.vms.${name}.extraArgs)"
        ++ refuseSet "qemu.pcieRootPorts" [] "root ports serve hot-plug and passthrough, which vmwarden does not offer; for q35 pass -device pcie-root-port,... through vmwarden.vms.${name}.extraArgs"
      )
      ++ lib.optionals ch (
        refuseSet "cloud-hypervisor.platformOEMStrings" [] "OEM strings are on cloud-hypervisor's command line, which every local user can read; deliver secrets with microvm.credentialFiles (fw_cfg from a file)"
      )
      ++ lib.optionals fc (
        refuseSet "firecracker.cpu" null "vmwarden's firecracker configuration has no CPU template; remove it"
        ++ refuseSet "firecracker.extraConfig" {} "vmwarden writes firecracker's configuration itself; remove it"
      )
      ++ extraProblems;

    hypervisorBinary =
      if qemu && setByGuest ["qemu" "package"]
      then "${g.qemu.package}/bin/qemu-system-${arch}"
      else if ch && setByGuest ["cloud-hypervisor" "package"]
      then "${g.cloud-hypervisor.package}/bin/cloud-hypervisor"
      else if fc && setByGuest ["firecracker" "package"]
      then "${g.firecracker.package}/bin/firecracker"
      else null;

    # ------------------------------------------------------------ kernel
    # lib/runners/qemu.nix, cloud-hypervisor.nix, firecracker.nix
    kernel =
      if qemu || arch != "x86_64"
      then "${g.kernel.out}/${linuxTarget}"
      else "${g.kernel.dev}/vmlinux";
    console =
      {
        x86_64 = "earlyprintk=ttyS0 console=ttyS0";
        aarch64 = "console=ttyAMA0";
      }
      .${
        arch
      }
      or "";
    params = toString g.kernelParams;
    cmdline =
      if qemu
      then
        join [
          (
            if g.qemu.serialConsole
            then console
            else ""
          )
          "reboot=t panic=-1"
          params
        ]
      else if ch
      then join [console "reboot=t panic=-1" params]
      else join ["console=ttyS0,115200 reboot=k panic=1 i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd" params];

    # ------------------------------------------------------------ disks
    volume = i: v: let
      at = "volumes[${toString i}]";
      path = abs v.image;
      size = builtins.tryEval v.size;
      own = vlib.isUnder stateDir path && path != stateDir;
      problems =
        refuse (!diskPathOk path) "${at}.image" v.image "it must resolve to a normalised absolute path without ',' (relative images are taken from ${stateDir}/)"
        ++ refuse (elem v.imageType ["vhd" "vhdx"]) "${at}.imageType" v.imageType "vmwarden's disk formats are raw and qcow2; convert the image (qemu-img convert)"
        ++ refuse (v.serial != null && !vlib.validSerial v.serial) "${at}.serial" v.serial "a serial is 1 to 20 bytes of ${vlib.serialRegex} (virtio-blk keeps 20; ',' would split QEMU's -drive)"
        ++ refuse (fc && v.serial != null) "${at}.serial" v.serial "firecracker's drives have no serial; remove it (microvm.nix drops it there with a warning)"
        ++ refuse (fc && v.direct) "${at}.direct" v.direct "firecracker's drives have no O_DIRECT mode (microvm.nix ignores it there with a warning); remove it"
        ++ lib.optionals v.autoCreate (
          refuse (!own) "${at}.autoCreate" true "vmwarden creates images only inside the VM's state directory (${stateDir}/); make the image path relative, or create the image yourself (owned by the VM's principal, mode 0600) and set autoCreate = false"
          ++ refuse (v.label != null) "${at}.label" v.label "vmwarden's create makes no file system label; create and label the image once yourself (mkfs -L), give it to the VM's principal and set autoCreate = false"
          ++ refuse (v.mkfsExtraArgs != []) "${at}.mkfsExtraArgs" v.mkfsExtraArgs "vmwarden's create runs its own mkfs without extra arguments; create the image yourself and set autoCreate = false"
          ++ refuse (!elem v.fsType vlib.createFsTypes) "${at}.fsType" v.fsType "vmwarden's create makes ${lib.concatStringsSep ", " vlib.createFsTypes} only; create the image yourself and set autoCreate = false"
          ++ refuse (v.imageType == "qcow2") "${at}.imageType" v.imageType "vmwarden's create makes raw images (microvm.nix too, whatever imageType says); set imageType = \"raw\", or create the qcow2 image yourself and set autoCreate = false"
          ++ refuse (!size.success) "${at}.size" null "autoCreate needs a size in MiB"
          ++ refuse (size.success && size.value < 1) "${at}.size" size.value "a created image needs a size of at least 1 MiB"
        );
    in {
      inherit problems;
      value =
        {
          inherit path;
          inherit (v) readOnly serial;
          format =
            if v.imageType == "raw"
            then null
            else v.imageType;
        }
        # microvm.nix's runners: QEMU cache=none only when direct and
        # discard=unmap always; cloud-hypervisor direct=on|off and its own
        # sparse=on. Written only where they differ from the launcher's
        # defaults (QEMU direct, no discard; cloud-hypervisor neither
        # direct nor a sparse=off).
        // optionalAttrs (qemu && !v.direct || ch && v.direct) {inherit (v) direct;}
        // optionalAttrs qemu {discard = true;}
        // optionalAttrs v.autoCreate {
          create = {
            sizeMiB = size.value;
            inherit (v) fsType;
          };
        };
    };
    volumes = lib.imap0 volume g.volumes;
    storeDisk = optional g.storeOnDisk ({
        path = "${g.storeDisk}";
        readOnly = true;
      }
      # microvm.nix reads its store disk through the host's page cache
      // optionalAttrs qemu {direct = false;});

    # ------------------------------------------------------------ shares
    share = i: s: let
      at = "shares[${toString i}]";
      source = abs s.source;
    in {
      problems =
        refuse fc "shares" (map (x: x.tag) g.shares) "firecracker has no shared file systems in vmwarden (nor in microvm.nix); use qemu or cloud-hypervisor, or a volume"
        ++ refuse (ch && s.proto == "9p") "${at}.proto" s.proto "cloud-hypervisor has no 9p; use proto = \"virtiofs\""
        ++ refuse (!vlib.validShareTag s.tag) "${at}.tag" s.tag "a tag is 1 to ${toString vlib.shareTagMax} bytes of ${vlib.shareTagRegex}; rename it (and the guest's mount with it)"
        ++ refuse (!diskPathOk source) "${at}.source" s.source "it must resolve to a normalised absolute path without ',' (relative sources are taken from ${stateDir}/)"
        # vmwarden's 9p model is QEMU's mapped-xattr, which microvm.nix calls
        # "mapped": a share written with it keeps its owners and modes.
        ++ refuse (s.proto == "9p" && !elem s.securityModel ["none" "mapped"]) "${at}.securityModel" s.securityModel "vmwarden's 9p security model is QEMU's mapped-xattr (\"mapped\"), which keeps the guest's owners and modes in extended attributes and puts no device node or setuid file on the host; a share written with ${s.securityModel} shows its files differently there: use \"mapped\" or remove it"
        ++ refuse (s.cache != "auto") "${at}.cache" s.cache "vmwarden runs virtiofsd with its default cache policy; remove it"
        ++ refuse (!s.posixAcl) "${at}.posixAcl" s.posixAcl "it only exists for virtiofsd's --translate-uid/--translate-gid, which vmwarden does not pass (a writable share's guest ids are mapped by its virtiofsd's user namespace); remove it"
        ++ refuse (s.extraArgs != []) "${at}.extraArgs" s.extraArgs "virtiofsd's arguments are vmwarden's (its socket, shared directory and sandbox); remove them";
      value = {
        inherit (s) tag proto;
        inherit source;
        # vmwarden never lets a guest write the host's store; microvm.nix's
        # guest mounts it read-only anyway.
        readOnly = s.readOnly || vlib.isUnder builtins.storeDir source;
      };
    };
    shares = lib.imap0 share g.shares;
    # A read-only share the guest mounts (its `fileSystems`, as microvm.nix's
    # mounts.nix declares them) without nosuid and nodev: vmwarden shows the
    # guest the host's own owners and modes there, so a set-id file any
    # writer of the source made (a build user, in the store) would be
    # honoured. vmwarden maps the guest, it does not build it: said, with
    # the line that fixes it, not refused.
    guestFileSystems = guest.config.fileSystems or {};
    unguardedShares = filter (s: let
      fsOpts = (guestFileSystems.${s.mountPoint} or {}).options or null;
    in
      (s.readOnly || vlib.isUnder builtins.storeDir (abs s.source))
      && fsOpts != null
      && !(elem "nosuid" fsOpts && elem "nodev" fsOpts)) (g.shares or []);
    shareWarnings = map (s: "vmwarden.vms.${name}.guest: the guest mounts the read-only share \"${s.tag}\" (${s.source}) at ${s.mountPoint} without nosuid,nodev; the guest sees the host's own owners and modes there, so a set-id file whoever may write ${s.source} made would be honoured in the guest. Add to the guest's configuration: fileSystems.\"${s.mountPoint}\".options = [\"nosuid\" \"nodev\"];") unguardedShares;
    pool = g.virtiofsd.threadPoolSize;
    poolOk = builtins.isInt pool || pool == "`nproc`";
    virtiofsProblems =
      refuse (g.virtiofsd.inodeFileHandles == "mandatory") "virtiofsd.inodeFileHandles" "mandatory" "file handles need CAP_DAC_READ_SEARCH on the host, and vmwarden's virtiofsd has no capability there; use \"prefer\" (the default) or \"never\""
      ++ refuse (!poolOk) "virtiofsd.threadPoolSize" g.virtiofsd.threadPoolSize "vmwarden takes a thread count or \"`nproc`\" (one thread per CPU, microvm.nix's default); use one of them"
      ++ refuseSet "virtiofsd.extraArgs" [] "virtiofsd's arguments are vmwarden's; remove them";

    # ------------------------------------------------------------ interfaces
    # Taps, bridges and macvtaps: vmwarden's interfaces (a tap each, or a
    # macvtap root makes on macvtap.link); type = "user": vmwarden's
    # userNetwork (passt), below.
    iface = i: n: let
      at = "interfaces[${toString i}]";
      typeOk = elem n.type ["tap" "bridge" "macvtap"];
      macvtap = n.type == "macvtap";
      bridge =
        if n.type == "bridge"
        then n.bridge
        else if macvtap
        then null
        else tapBridges.${n.id} or null;
    in {
      isTap = n.type != "user";
      problems =
        refuse (macvtap && fc) "${at}.type" n.type "firecracker opens its network devices by name and cannot take a macvtap's queues as the fds root opened (microvm.nix has no macvtap there either); use type = \"tap\" on a bridge, or qemu or cloud-hypervisor"
        ++ refuse (macvtap && !vlib.validBridgeName n.macvtap.link) "${at}.macvtap.link" n.macvtap.link "the host interface the macvtap sits on: 1 to ${toString vlib.ifNameMax} bytes of letters, digits, '_', '.', '-', and never a VM's link (${vlib.tapPrefix}*)"
        ++ lib.optionals typeOk (
          refuse (builtins.match vlib.tapNameRegex n.id == null) "${at}.id" n.id "vmwarden's taps are named ^${vlib.tapNameRegex}$ (cleanup, reap and verify-clean touch only those); rename it, e.g. \"vmw-${builtins.substring 0 11 name}${toString i}\" (the guest never sees the host-side name)"
          ++ refuse (builtins.match vlib.macRegex n.mac == null) "${at}.mac" n.mac "a MAC is six hex pairs separated by ':'"
          ++ refuse (!qemu && (n.tap.vhost or false)) "${at}.tap.vhost" true "${hv}'s network devices run in ${hv} itself, not in the kernel's vhost-net (microvm.nix ignores it there); set it to false"
          ++ refuse (bridge != null && !vlib.validBridgeName bridge) "${at}.bridge" bridge "not a bridge name the launcher accepts"
        );
      value =
        {
          tap = n.id;
          inherit (n) mac;
        }
        // optionalAttrs (bridge != null) {inherit bridge;}
        // optionalAttrs macvtap {
          type = "macvtap";
          macvtap = {inherit (n.macvtap) link mode;};
        }
        # microvm.nix's runners: vhost=on with tap.vhost (QEMU); as many
        # queue pairs as vCPUs when there is more than one (QEMU, and
        # cloud-hypervisor's num_queues), none of it on firecracker.
        // optionalAttrs (qemu && !macvtap && (n.tap.vhost or false)) {vhost = true;}
        // optionalAttrs (!fc && elem n.type ["tap" "macvtap"] && g.vcpu > 1 && g.vcpu <= 255) {queues = g.vcpu;};
    };
    ifaces = filter (x: x.isTap) (lib.imap0 iface g.interfaces);

    # ------------------------------------------------------------ user network
    # microvm.nix's type = "user" interface (QEMU's SLIRP) and forwardPorts
    # become vmwarden's userNetwork, served by passt (QEMU only). The
    # forwards are checked as the launcher checks them, named after the
    # guest's options; the host's port floor is checked on the host.
    userIfaces = filter (x: x.n.type == "user") (lib.imap0 (i: n: {inherit i n;}) g.interfaces);
    userIface = lib.findFirst (_: true) null userIfaces;
    userNetProblems =
      concatLists (map ({
        i,
        n,
      }: let
        at = "interfaces[${toString i}]";
      in
        refuse (!qemu) "${at}.type" n.type "${hv} has no user networking in vmwarden (passt serves a guest over QEMU's stream socket); use type = \"tap\" (with vmwarden.vms.${name}.tapBridges) or hypervisor = \"qemu\""
        ++ refuse (userIface != null && i != userIface.i) "${at}.type" n.type "vmwarden gives a VM one user-networking interface (one passt; microvm.nix's forwardPorts serve one too); remove it, or make it a tap"
        ++ refuse (!vlib.validUserNetId n.id) "${at}.id" n.id "a user interface's id is a letter, then letters, digits, '-', '.' or '_', at most ${toString vlib.userNet.id_max} bytes (QEMU's netdev id), and not net0, net1, ... (the taps'); rename it"
        ++ refuse (builtins.match vlib.macRegex n.mac == null || !vlib.unicastMac n.mac) "${at}.mac" n.mac "a MAC is six hex pairs separated by ':', unicast (the first octet even) and not all zero")
      userIfaces)
      ++ refuse (g.forwardPorts != [] && userIface == null) "forwardPorts" g.forwardPorts "it forwards to an interface of type = \"user\", which this guest does not have (microvm.nix ignores it then, with a warning); add one, or forward on the host to a tap"
      ++ map (m: "microvm.${m}") (vlib.forwardPortProblems "forwardPorts" g.forwardPorts);
    userNetwork = optionalAttrs (qemu && userIface != null) {
      enable = true;
      inherit (userIface.n) id mac;
      inherit (g) forwardPorts;
    };

    # ------------------------------------------------------------ credentials
    cred = c: path: let
      p = toString path;
      at = "credentialFiles.${c}";
    in {
      problems =
        refuse (!vlib.validCredName c) at p "credential names are ^${vlib.credNameRegex}$; rename it (the guest's LoadCredential= with it)"
        ++ refuse (builtins.stringLength (vlib.fwCfgName c) > vlib.fwCfgMax) at p "QEMU keeps fw_cfg names of ${toString vlib.fwCfgMax} bytes, which leaves ${toString (vlib.fwCfgMax - builtins.stringLength vlib.fwCfgPrefix)} bytes for the name; shorten it"
        ++ refuse (!vlib.isNormalAbsolutePath p) at p "it must be a normalised absolute path (systemd reads it with LoadCredential=)"
        ++ refuse (vlib.isUnder builtins.storeDir p) at p "it is in the Nix store, which every local user can read (a Nix path literal copies the secret there); give the path of a root-only file as a string, e.g. sops-nix's or agenix's /run/secrets/... path";
      value = p;
    };
    creds = lib.mapAttrs cred g.credentialFiles;
    credProblems =
      refuse (fc && g.credentialFiles != {}) "credentialFiles" (builtins.attrNames g.credentialFiles) "firecracker has no channel that keeps a secret off its command line (no fw_cfg, no SMBIOS; systemd imports initrd credentials only as encrypted ones); use hypervisor = \"qemu\" or \"cloud-hypervisor\" (fw_cfg from a file)";

    # ------------------------------------------------------------ vsock
    cid = g.vsock.cid;
    vsockProblems =
      refuse (cid != null && !vlib.validCid cid) "vsock.cid" cid "CIDs 0, 1 and 2 are the hypervisor, loopback and the host; pick one from ${toString vlib.vsockCidMin} to ${toString vlib.vsockCidMax}, unique across the host's VMs";
    # microvm.vsock.ssh.enable (nixos-modules/microvm/vsock-ssh.nix): the
    # guest's sshd listens on vsock port 22 for `ssh vsock/<cid>` from the
    # host, which reaches a guest through the kernel's vhost-vsock only, as
    # microvm.nix's QEMU runner gives it (lib/runners/qemu.nix,
    # vhost-vsock-*). So such a QEMU guest gets the "vhost" backend; a host
    # definition of vsock.backend still wins. cloud-hypervisor and
    # firecracker serve a hybrid vsock socket of their own instead, which
    # `ssh vsock-mux/<socket>` reaches (docs/microvm-nix.md).
    sshOverVsock = noGuest == [] && qemu && cid != null && (g.vsock.ssh.enable or false);

    problemsOf = xs: concatLists (map (x: x.problems) xs);
    okValues = xs: map (x: x.value) (filter (x: x.problems == []) xs);
    credsOk = lib.filterAttrs (_: x: x.problems == []) creds;

    enabled = g.guest.enable;
    noGuest =
      if !hasMicrovm
      then ["it has no config.microvm: give it a NixOS configuration that imports microvm.nixosModules.microvm (e.g. self.nixosConfigurations.${name}), or set kernel, initrd and cmdline instead of guest"]
      else refuse (!enabled) "guest.enable" false "with it off the configuration is no microVM guest (no init=, no store mounts); enable it, or set kernel, initrd and cmdline instead of guest";

    problems =
      if noGuest != []
      then noGuest
      else
        topProblems
        ++ lib.optionals (elem hv supportedHypervisors) (
          hvProblems
          ++ problemsOf volumes
          ++ problemsOf shares
          ++ virtiofsProblems
          ++ problemsOf ifaces
          ++ userNetProblems
          ++ concatLists (lib.mapAttrsToList (_: x: x.problems) creds)
          ++ credProblems
          ++ vsockProblems
        );

    values =
      if noGuest != [] || !elem hv supportedHypervisors
      then {}
      else
        {
          hypervisor = hv;
          inherit kernel cmdline;
          initrd = toString g.initrdPath;
          disks = storeDisk ++ okValues volumes;
          shares = okValues shares;
          interfaces = okValues ifaces;
          credentials = lib.optionalAttrs (credProblems == []) (lib.mapAttrs (_: x: x.value) credsOk);
          extraArgs =
            if extraProblems == []
            then extraArgs
            else [];
        }
        // optionalAttrs (g.vcpu <= 255) {vcpus = g.vcpu;}
        // optionalAttrs (g.mem >= 16 && g.mem <= 1048576) {memoryMiB = g.mem;}
        # A PCI device needs a PCI bus, which vmwarden's microvm machine has
        # not (microvm.nix turns on its pcie=on): q35 instead.
        // optionalAttrs (qemu && machineOk) {
          machine =
            if machine.value == "microvm" && g.devices != []
            then "q35"
            else machine.value;
        }
        // optionalAttrs (g.devices != [] && !fc) {
          devices =
            map (d: {
              inherit (d) bus path;
              inherit (d.qemu) id;
              qemuBus = d.qemu.bus;
              qemuProperties = lib.optionals (d.qemu.deviceExtraArgs != null) (lib.splitString "," d.qemu.deviceExtraArgs);
            })
            g.devices;
        }
        // optionalAttrs (hypervisorBinary != null) {inherit hypervisorBinary;}
        // optionalAttrs (setByGuest ["virtiofsd" "package"]) {virtiofsdBinary = "${g.virtiofsd.package}/bin/virtiofsd";}
        // optionalAttrs poolOk {
          virtiofsdThreadPoolSize =
            if builtins.isInt pool
            then pool
            else "nproc";
        }
        // optionalAttrs (cid != null && vsockProblems == []) {
          vsock =
            {inherit cid;}
            // optionalAttrs sshOverVsock {backend = "vhost";};
        }
        # The host's own tools, under microvm.nix's own names.
        // optionalAttrs (g.balloon && !fc) {
          balloon = true;
          inherit (g) initialBalloonMem deflateOnOOM;
        }
        // optionalAttrs g.hugepageMem {hugepageMem = true;}
        // optionalAttrs g.registerWithMachined {registerWithMachined = true;}
        // optionalAttrs (userNetwork != {} && userNetProblems == []) {inherit userNetwork;};

    tapIds =
      if noGuest != []
      then []
      else map (n: n.id) (filter (n: n.type == "tap") g.interfaces);
  in {
    inherit values problems tapIds sshOverVsock shareWarnings;
  };

  # Options a guest can give values to.
  derivedOptions = [
    "hypervisor"
    "hypervisorBinary"
    "vcpus"
    "memoryMiB"
    "machine"
    "kernel"
    "initrd"
    "cmdline"
    "disks"
    "shares"
    "interfaces"
    "credentials"
    "devices"
    "extraArgs"
    "virtiofsdBinary"
    "balloon"
    "initialBalloonMem"
    "deflateOnOOM"
    "registerWithMachined"
    "virtiofsdThreadPoolSize"
    "hugepageMem"
  ];

  # The values as definitions of vmwarden.vms.<name>, each lib.mkDefault,
  # so that a plain definition on the host wins. A list or attribute set
  # from the guest is replaced as a whole by a plain host definition; to
  # add to it, define the host's entries at the same priority:
  # lib.mkDefault (lib.mkAfter [ … ]), lib.mkDefault { … }.
  # The attribute names are fixed (each value sits behind an mkIf): the
  # module system needs a module's attribute names to find the definitions
  # of `guest` itself, so they must not depend on the guest.
  asDefaults = values:
    lib.genAttrs derivedOptions (k: lib.mkIf (values ? ${k}) (lib.mkDefault values.${k}))
    // {
      vsock = {
        cid = lib.mkIf (values ? vsock) (lib.mkDefault values.vsock.cid);
        backend = lib.mkIf (values ? vsock && values.vsock ? backend) (lib.mkDefault values.vsock.backend);
      };
      # Option by option: the module system reads a definition of a set of
      # options (mkIf or not) for its attribute names.
      userNetwork =
        lib.genAttrs ["enable" "id" "mac" "forwardPorts"] (k:
          lib.mkIf (values ? userNetwork) (lib.mkDefault values.userNetwork.${k}));
    };
}
