# The user-facing options (docs/nixos.md). Every field of
# the launch spec has an option here; host.nix turns them into the spec,
# the users and the units.
{
  config,
  lib,
  pkgs,
  ...
}: let
  inherit (lib) literalExpression mkEnableOption mkOption types;
  vlib = import ./lib.nix {inherit lib;};
  guestLib = import ./microvm-guest.nix {inherit lib;};

  absolutePath = lib.mkOptionType {
    name = "vmwardenAbsolutePath";
    description = "normalised absolute path (a string starting with `/`; no `.`, `..` or empty components, no trailing `/`; no whitespace, `%`, quotes or backslashes)";
    descriptionClass = "noun";
    check = vlib.isNormalAbsolutePath;
    merge = lib.mergeEqualOption;
  };

  # QEMU's -drive splits on ',' (the launcher refuses it too).
  diskPath =
    absolutePath
    // {
      name = "vmwardenDiskPath";
      description = "${absolutePath.description}, without `,`";
      check = p: absolutePath.check p && !lib.hasInfix "," p;
    };

  # Share sources: like disk paths, they stand in QEMU's key=value lists.
  sharePath =
    diskPath
    // {
      name = "vmwardenSharePath";
    };

  relativePath = lib.mkOptionType {
    name = "vmwardenRelativePath";
    description = "normalised relative path (no leading `/`, no `.`, `..` or empty components)";
    descriptionClass = "noun";
    check = vlib.isNormalRelativePath;
    merge = lib.mergeEqualOption;
  };

  # microvm.nix's forwardPorts entries, with its names and defaults.
  forwardPortModule = let
    end = what: {
      address = mkOption {
        type = types.str;
        default = "";
        example = "127.0.0.1";
        description = ''
          The ${what}'s IPv4 address; `""` means ${
            if what == "host"
            then "every IPv4 address of the host (as QEMU's `hostfwd` binds it under microvm.nix)"
            else "the guest's address, ${vlib.userNet.guest_address}"
          }.
        '';
      };
      port = mkOption {
        type = types.port;
        description = "The ${what}'s port (1 to 65535).";
      };
    };
  in {
    options = {
      from = mkOption {
        type = types.enum ["host" "guest"];
        default = "host";
        description = ''
          `"host"`: connections to the host's port go to the guest's port
          (passt listens on the host, as the VM's principal). `"guest"`:
          the guest's connections to `guest.address:guest.port` go to the
          host's port; passt can do this only for the host's loopback,
          which the guest reaches as the gateway ${vlib.userNet.gateway}, port for port
          (so `guest.address = "${vlib.userNet.gateway}"`,
          `host.address = "${vlib.userNet.host_loopback}"`, `host.port = guest.port`).
        '';
      };
      proto = mkOption {
        type = types.enum ["tcp" "udp"];
        default = "tcp";
        description = "The protocol to forward.";
      };
      host = end "host";
      guest = end "guest";
    };
  };

  interfaceModule = {
    options = {
      tap = mkOption {
        type = types.strMatching vlib.tapNameRegex;
        example = "vmw-web0";
        description = ''
          Name of the tap the launcher creates for this interface
          (`^${vlib.tapNameRegex}$`: the `${vlib.tapPrefix}` prefix marks vmwarden's taps,
          ${toString vlib.ifNameMax} bytes at most). The tap is non-persistent: the kernel deletes it
          when the hypervisor exits, however it exits. Unique across VMs.
        '';
      };
      bridge = mkOption {
        type = types.nullOr (types.strMatching vlib.ifNameRegex);
        default = null;
        example = "br0";
        description = ''
          Existing bridge the tap is attached to (vmwarden does not create
          bridges: use e.g. {option}`networking.bridges`); not `.`, `..` or a
          name starting with `${vlib.tapPrefix}`. `null` leaves the tap
          unattached (route to it instead).
        '';
      };
      mac = mkOption {
        type = types.nullOr (types.strMatching vlib.macRegex);
        default = null;
        example = "02:00:00:00:00:01";
        description = ''
          Guest MAC address (unicast). `null` derives a stable locally
          administered one from the VM and tap names. The host side of the
          tap gets the same address with the first octet `fe`.
        '';
      };
      vhost = mkOption {
        type = types.nullOr types.bool;
        default = null;
        description = ''
          Run the NIC's queues in the kernel's vhost-net (microvm.nix's
          `tap.vhost`; QEMU only): the launcher opens {file}`/dev/vhost-net`
          as root, once per queue, and hands QEMU the descriptors. `null`
          (off) writes nothing into the spec. Off by default: vhost-net
          moves the virtqueues the guest drives into the host kernel,
          outside the VM's sandbox (docs/networking.md).
        '';
      };
      queues = mkOption {
        type = types.nullOr (types.ints.between 1 255);
        default = null;
        example = 4;
        description = ''
          Queue pairs of the tap, one file descriptor each, all opened by
          the launcher (microvm.nix: the VM's vCPUs when it has more than
          one). QEMU gets them with `mq=on` on a PCI machine,
          cloud-hypervisor as `num_queues`; not on firecracker. `null` (one)
          writes nothing into the spec.
        '';
      };
      type = mkOption {
        type = types.enum ["tap" "macvtap"];
        default = "tap";
        description = ''
          What the launcher makes for the interface (microvm.nix's
          `interfaces.*.type`): `"tap"`, on {option}`bridge` if set; or
          `"macvtap"` (QEMU and cloud-hypervisor): a macvtap named
          {option}`tap` on the host interface {option}`macvtap.link`, with
          the guest's MAC, made by the launcher as root before its
          privilege drop, its character device opened once per queue and
          handed to the hypervisor (the VM's principal never gets the
          node), and deleted by the unit's cleanup after every stop.
        '';
      };
      macvtap = {
        link = mkOption {
          type = types.nullOr (types.strMatching vlib.ifNameRegex);
          default = null;
          example = "enp3s0";
          description = ''
            The host interface a `type = "macvtap"` interface sits on
            (microvm.nix's `macvtap.link`): a NIC, a bond, a VLAN or a
            bridge that exists when the VM starts; never a VM's own link
            (`${vlib.tapPrefix}*`).
          '';
        };
        mode = mkOption {
          type = types.nullOr (types.enum ["private" "vepa" "bridge" "passthru" "source"]);
          default = null;
          example = "bridge";
          description = ''
            The macvtap's mode (microvm.nix's `macvtap.mode`, as
            `ip link … type macvtap mode`): `"bridge"` lets the macvtaps
            of one link reach each other directly; `"vepa"` sends
            everything out through the link's switch; `"private"` keeps
            them apart; `"passthru"` gives the one macvtap of a link
            every frame it receives; `"source"` receives only frames for
            its own MAC (the launcher lists no source addresses). The
            host itself never reaches a guest through its own link.
          '';
        };
      };
    };
  };

  # Same naming as the `qemu-system-*` binaries.
  qemuArch = pkgs.stdenv.hostPlatform.qemuArch or "x86_64";

  diskModule = {
    options = {
      path = mkOption {
        type = diskPath;
        example = "/var/lib/vmwarden/web/root.img";
        description = ''
          Host path of the disk image, attached as a virtio block device in
          list order. Keep images outside {file}`/home`, {file}`/root`,
          {file}`/run/user`, {file}`/tmp` and {file}`/var/tmp`: the unit
          hides those directories. The VM's principal must be able to open
          the image (for example, own it).
        '';
      };
      readOnly = mkOption {
        type = types.bool;
        default = false;
        description = "Attach the image read-only.";
      };
      format = mkOption {
        type = types.nullOr (types.enum ["raw" "qcow2"]);
        default = null;
        description = ''
          Image format. `null` means raw, the launcher's default, and writes
          nothing into the spec. firecracker takes raw images only.
        '';
      };
      serial = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "var";
        description = ''
          Serial number the guest sees (`/dev/disk/by-id/virtio-<serial>`):
          1 to 20 bytes (virtio-blk keeps 20) of `${vlib.serialRegex}`. Not
          on firecracker.
        '';
      };
      direct = mkOption {
        type = types.nullOr types.bool;
        default = null;
        description = ''
          Open the image with `O_DIRECT`, past the host's page cache
          (microvm.nix's `direct`): QEMU `cache=none`, cloud-hypervisor
          `direct=on`. `null` keeps the launcher's default and writes
          nothing into the spec: on for QEMU, off for cloud-hypervisor.
          firecracker has no such mode (`true` is refused there).
        '';
      };
      discard = mkOption {
        type = types.nullOr types.bool;
        default = null;
        description = ''
          Let the guest's discards (TRIM) free the image's blocks: QEMU
          `discard=unmap`, cloud-hypervisor `sparse=on`. `null` keeps each
          hypervisor's default and writes nothing into the spec: QEMU
          ignores discards, cloud-hypervisor punches holes. firecracker has
          no discard (`true` is refused there).
        '';
      };
      create = mkOption {
        type = types.nullOr (types.submodule createModule);
        default = null;
        example = literalExpression "{ sizeMiB = 1024; fsType = \"ext4\"; }";
        description = ''
          Create the image at the first start if it does not exist: a
          sparse file of {option}`sizeMiB`, owned by the VM's principal,
          mode 0600, formatted with {option}`fsType` by the launcher as the
          principal inside the VM's sandbox. Only for a path inside the
          VM's state directory ({file}`/var/lib/vmwarden/<name>/`); an
          existing image is never touched. Cleanup keeps it; `vmwarden
          purge` deletes it unless it is in {option}`keepOnPurge`.
        '';
      };
    };
  };

  createModule = {
    options = {
      sizeMiB = mkOption {
        type = types.ints.positive;
        example = 1024;
        description = "Size of the new image in MiB (sparse: it takes space as the guest writes).";
      };
      fsType = mkOption {
        type = types.nullOr (types.enum vlib.createFsTypes);
        default = "ext4";
        description = ''
          File system to create on the new image, or `null` for an
          unformatted one. With `"ext4"` the module puts `e2fsprogs` in the
          system profile, where the launcher finds `mkfs.ext4`.
        '';
      };
    };
  };

  shareModule = {
    options = {
      tag = mkOption {
        type = types.str;
        example = "ro-store";
        description = ''
          The tag the guest mounts the share by: at most ${toString vlib.shareTagMax} bytes of
          `${vlib.shareTagRegex}`, unique in the VM.
        '';
      };
      source = mkOption {
        type = sharePath;
        example = "/var/lib/vmwarden/web/data";
        description = ''
          Host directory to share. A writable share must belong to the VM's
          principal (for example inside {file}`/var/lib/vmwarden/<name>/`);
          no share may lie in another VM's directories or in
          {file}`/run/vmwarden`, and {file}`/nix/store` is shared read-only
          only. The launcher checks ownership and modes at start.
        '';
      };
      proto = mkOption {
        type = types.enum ["virtiofs" "9p"];
        default = "virtiofs";
        description = ''
          `"virtiofs"`: the launcher starts one `virtiofsd` per share as the
          VM's principal, in the VM's mount namespace, without capabilities.
          `"9p"`: QEMU's own `-virtfs`, no extra process (QEMU only).
          cloud-hypervisor takes virtiofs shares only, firecracker none.
        '';
      };
      readOnly = mkOption {
        type = types.bool;
        default = false;
        description = "Share read-only.";
      };
    };
  };

  vmModule = {
    name,
    config,
    ...
  }: {
    # A microvm.nix guest's settings, as defaults (microvm-guest.nix).
    config =
      guestLib.asDefaults
      (guestLib.derive {
        inherit name;
        inherit (config) guest tapBridges;
        hostSystem = pkgs.stdenv.hostPlatform.system or null;
      })
      .values;

    options = {
      guest = mkOption {
        type = types.nullOr types.raw;
        default = null;
        example = literalExpression "self.nixosConfigurations.web";
        description = ''
          A microvm.nix guest: an evaluated NixOS configuration that imports
          `microvm.nixosModules.microvm` (a `lib.nixosSystem` result, or
          anything with `config.microvm` and `pkgs`). Its `config.microvm`
          gives this VM's defaults: hypervisor, vcpus, memory, kernel,
          initrd and command line (as microvm.nix's runners form them), the
          store disk and volumes (relative images in
          {file}`/var/lib/vmwarden/<name>/`, created there when
          `autoCreate`), shares (relative sources likewise), tap
          interfaces, `vsock.cid`, `credentialFiles` (as
          {option}`credentials`) and the hypervisor's `extraArgs`. Each is
          a `lib.mkDefault`: a plain definition here wins, a list or
          attribute set as a whole (add to the guest's at the same
          priority: `lib.mkDefault (lib.mkAfter [ … ])`).
          A guest setting vmwarden cannot honour fails the evaluation with
          a message naming it and what to do instead; the table of every
          option is in vmwarden's docs/microvm-nix.md.
        '';
      };

      tapBridges = mkOption {
        type = types.attrsOf (types.strMatching vlib.ifNameRegex);
        default = {};
        example = {"vmw-web0" = "br0";};
        description = ''
          Bridges for the {option}`guest`'s `type = "tap"` interfaces, by
          interface `id` (microvm.nix leaves attaching those taps to the
          host; vmwarden's launcher attaches them). A tap not named here
          stays unattached (route to it instead). Interfaces of
          `type = "bridge"` name their bridge in the guest.
        '';
      };

      hypervisor = mkOption {
        type = types.enum ["qemu" "cloud-hypervisor" "firecracker"];
        default = "qemu";
        description = ''
          Hypervisor that runs this VM. `"cloud-hypervisor"` and
          `"firecracker"` run only on KVM. `"cloud-hypervisor"` gets
          {option}`credentials` as fw_cfg files, which needs a build with
          its `fw_cfg` feature (see {option}`hypervisorBinary`);
          `"firecracker"` takes no {option}`credentials` (it has no channel
          that keeps a secret off its command line).
        '';
      };

      hypervisorBinary = mkOption {
        type = absolutePath;
        default =
          if config.hypervisor == "qemu"
          then "${pkgs.qemu_kvm}/bin/qemu-system-${qemuArch}"
          else if config.hypervisor == "cloud-hypervisor" && config.credentials != {}
          then "${vlib.cloudHypervisorWithFwCfg pkgs.cloud-hypervisor}/bin/cloud-hypervisor"
          else "/run/current-system/sw/bin/${config.hypervisor}";
        defaultText = literalExpression ''
          if hypervisor == "qemu" then "''${pkgs.qemu_kvm}/bin/qemu-system-''${pkgs.stdenv.hostPlatform.qemuArch}"
          else if hypervisor == "cloud-hypervisor" && credentials != {}
          then "''${pkgs.cloud-hypervisor.overrideAttrs (o: { cargoBuildFeatures = (o.cargoBuildFeatures or []) ++ ["fw_cfg"]; … })}/bin/cloud-hypervisor"
          else "/run/current-system/sw/bin/''${hypervisor}"'';
        example = literalExpression ''"''${pkgs.qemu}/bin/qemu-system-x86_64"'';
        description = ''
          Absolute path of the hypervisor executable the launcher execs.
          A cloud-hypervisor VM with {option}`credentials` needs a build
          with the `fw_cfg` feature (credentials reach the guest as fw_cfg
          files `opt/io.systemd.credentials/NAME`); nixpkgs builds it
          without, so the default is then nixpkgs' cloud-hypervisor rebuilt
          with the feature turned on. The launcher checks the binary
          (`--help` lists `--fw-cfg-config` only in such a build) and refuses
          the VM, naming the feature, when it lacks it.
        '';
      };

      accel = mkOption {
        type = types.enum ["kvm" "tcg"];
        default = "kvm";
        description = ''
          QEMU accelerator. `"tcg"` emulates the CPU in software (slow; for
          hosts without usable KVM, e.g. nested test VMs).
        '';
      };

      machine = mkOption {
        type = types.enum (builtins.attrNames vlib.machineArch);
        default =
          if qemuArch == "aarch64"
          then "virt"
          else "microvm";
        defaultText = literalExpression ''if pkgs.stdenv.hostPlatform.qemuArch == "aarch64" then "virt" else "microvm"'';
        description = ''
          QEMU machine type: `"microvm"`, `"pc"` or `"q35"` with
          `qemu-system-x86_64`, `"virt"` with `qemu-system-aarch64`.
        '';
      };

      extraArgs = mkOption {
        type = types.listOf types.str;
        default = [];
        example = ["-device" "virtio-rng-pci"];
        description = ''
          Arguments passed to the hypervisor after vmwarden's own: the
          escape hatch for what vmwarden does not model. Never a secret
          (the spec and the process's command line are world-readable).
          Refused where an argument would undo a guarantee: for QEMU
          `-sandbox`, `-runas`, `-run-with`, `-chroot`, `-daemonize`,
          `-readconfig`, `-set`, a `-qmp`/`-monitor`/`-chardev socket`
          outside {file}`/run/vmwarden/<name>/control/`, network or
          outside sockets for `-serial`/`-parallel`/`-debugcon`/`-gdb`,
          `-fw_cfg` with a `file=` or a credential's name,
          `-netdev`/`-nic`/`-net` of type `tap` or `bridge`; for
          cloud-hypervisor `--api-socket`,
          `--seccomp`, `--net`, `--fs`, `--vsock`, `--serial`, `--console`,
          `--cpus`, `--platform`; for firecracker `--api-sock`,
          `--config-file`, `--no-api`, `--no-seccomp`, `--seccomp-filter`.
          Anything else runs inside the VM's sandbox, as its principal.
        '';
      };

      vcpus = mkOption {
        type = types.ints.between 1 255;
        default = 1;
        description = "Number of virtual CPUs.";
      };

      memoryMiB = mkOption {
        type = types.ints.between 16 1048576;
        default = 512;
        description = "Guest memory in MiB.";
      };

      kernel = mkOption {
        type = absolutePath;
        example = literalExpression ''"''${pkgs.linuxPackages_latest.kernel}/bzImage"'';
        description = "Absolute path of the guest kernel image.";
      };

      initrd = mkOption {
        type = types.nullOr absolutePath;
        default = null;
        example = literalExpression ''"''${guest.config.system.build.initialRamdisk}/initrd"'';
        description = "Absolute path of the guest initrd, or `null` for none.";
      };

      cmdline = mkOption {
        type = types.str;
        default = "console=ttyS0";
        example = "console=ttyS0 reboot=t panic=-1";
        description = "Guest kernel command line. Never put secrets here: use {option}`credentials`.";
      };

      interfaces = mkOption {
        type = types.listOf (types.submodule interfaceModule);
        default = [];
        example = literalExpression ''[ { tap = "vmw-web0"; bridge = "br0"; mac = "02:00:00:00:00:01"; } ]'';
        description = ''
          Network interfaces: one virtio NIC per entry, backed by a tap the
          launcher creates, attaches to {option}`bridge` and hands to the
          hypervisor as an open file descriptor, or by a macvtap on a host
          interface ({option}`type`).
        '';
      };

      disks = mkOption {
        type = types.listOf (types.submodule diskModule);
        default = [];
        example = literalExpression ''[ { path = "/var/lib/vmwarden/web/root.img"; } ]'';
        description = "Disk images, attached in order as virtio block devices.";
      };

      shares = mkOption {
        type = types.listOf (types.submodule shareModule);
        default = [];
        example = literalExpression ''
          [
            { tag = "ro-store"; source = "/nix/store"; readOnly = true; }
            { tag = "data"; source = "/var/lib/vmwarden/web/data"; }
          ]
        '';
        description = "Host directories shared with the guest (virtiofs or 9p).";
      };

      virtiofsdBinary = mkOption {
        type = absolutePath;
        default = "${pkgs.virtiofsd}/bin/virtiofsd";
        defaultText = literalExpression ''"''${pkgs.virtiofsd}/bin/virtiofsd"'';
        description = "The `virtiofsd` the launcher runs for each virtiofs share.";
      };

      virtiofsdThreadPoolSize = mkOption {
        type = types.nullOr (types.either types.ints.unsigned (types.enum ["nproc"]));
        default = null;
        example = "nproc";
        description = ''
          virtiofsd's `--thread-pool-size` (microvm.nix's
          `virtiofsd.threadPoolSize`): a thread count (0: no pool), or
          `"nproc"` for one thread per CPU the launcher may run on. `null`
          keeps virtiofsd's own default (no pool) and writes nothing into
          the spec.
        '';
      };

      vsock = {
        cid = mkOption {
          type = types.nullOr types.ints.unsigned;
          default = null;
          example = 5;
          description = ''
            The guest's vsock address (CID), which gives it a virtio-vsock
            device: ${toString vlib.vsockCidMin} to ${toString vlib.vsockCidMax}, unique across VMs.
          '';
        };
        backend = mkOption {
          type = types.enum ["user" "vhost"];
          default = "user";
          description = ''
            `"user"`: the host side is a unix socket in
            {file}`/run/vmwarden/<name>/control/`, reachable by root only;
            QEMU gets it from `vhost-device-vsock` ({option}`vsock.binary`),
            run as the VM's principal; cloud-hypervisor serves it itself.
            `"vhost"` (QEMU only): the kernel's vhost-vsock, as microvm.nix
            uses it: the guest is reachable over host-wide `AF_VSOCK`
            (`ssh vsock/<cid>`) by every local user; the launcher opens
            {file}`/dev/vhost-vsock` as root and hands QEMU the fd.
          '';
        };
        binary = mkOption {
          type = absolutePath;
          default = "${pkgs.vhost-device-vsock}/bin/vhost-device-vsock";
          defaultText = literalExpression ''"''${pkgs.vhost-device-vsock}/bin/vhost-device-vsock"'';
          description = "The `vhost-device-vsock` the launcher runs for QEMU's `\"user\"` backend.";
        };
        # -- the guest's notify socket (firecracker) --
        notify = mkOption {
          type = types.nullOr types.bool;
          default = null;
          description = ''
            Firecracker only: a poweroff inside the guest ends the VM, its
            unit inactive and not failed, as on QEMU and cloud-hypervisor.
            firecracker has no ACPI power-off, so the launcher gives the
            guest's systemd the credential `vmm.notify_socket` on the
            kernel command line
            (`systemd.set_credential=vmm.notify_socket:vsock-stream:2:<port>`)
            and listens on that vsock port; when the guest's systemd says
            `X_SYSTEMD_SHUTDOWN=poweroff` (systemd 256 and later), firecracker
            is ended with SIGTERM. `null`: on for a firecracker VM with a
            {option}`vsock.cid`; `false`: off. A guest without such a systemd
            is unaffected: its poweroff halts it, and firecracker runs on
            until the unit is stopped.
          '';
        };
        notifyPort = mkOption {
          type = types.nullOr (types.ints.between 1 vlib.vsockPortMax);
          default = null;
          example = 9999;
          description = "The host vsock port of the guest's notify socket ({option}`vsock.notify`); `null`: ${toString vlib.vmmNotifyPort}, the port microvm.nix's cloud-hypervisor runner uses.";
        };
      };

      userNetwork = {
        enable = mkEnableOption ''
          an interface on a user network (QEMU only), as microvm.nix's
          `interfaces = [ { type = "user"; … } ]` gives one: passt, run by
          the launcher as the VM's principal in a sandbox of its own, turns
          the guest's traffic into the principal's own sockets on the host.
          The guest sees QEMU SLIRP's network: its address
          ${vlib.userNet.guest_address}/${toString vlib.userNet.prefix_len} by DHCP, the gateway ${vlib.userNet.gateway}, which reaches the
          host's loopback, and the DNS server ${vlib.userNet.dns}, which forwards to the
          host's resolver. The VM's unit then allows IP sockets and the
          user, UTS and PID namespaces passt's own sandbox needs
          (docs/networking.md)'';
        id = mkOption {
          type = types.str;
          default = "user0";
          example = "qemu";
          description = ''
            The interface's id (QEMU's netdev id, microvm.nix's
            `interfaces.*.id`): a letter, then letters, digits, `-`, `.` or
            `_`, at most ${toString vlib.userNet.id_max} bytes; not `net0`, `net1`, ... (the taps').
          '';
        };
        mac = mkOption {
          type = types.nullOr (types.strMatching vlib.macRegex);
          default = null;
          example = "02:00:00:01:01:01";
          description = "Guest MAC address (unicast); `null` leaves QEMU's default.";
        };
        binary = mkOption {
          type = absolutePath;
          default = "${pkgs.passt}/bin/passt";
          defaultText = literalExpression ''"''${pkgs.passt}/bin/passt"'';
          description = "The `passt` the launcher runs for the interface.";
        };
        forwardPorts = mkOption {
          type = types.listOf (types.submodule forwardPortModule);
          default = [];
          example = literalExpression ''[ { host.port = 2222; guest.port = 22; } ]'';
          description = ''
            microvm.nix's `forwardPorts`, served by passt. A host port
            below the host's `net.ipv4.ip_unprivileged_port_start`
            ({option}`boot.kernel.sysctl`, 1024 by default) is refused:
            passt binds it as the VM's principal.
          '';
        };
      };

      credentials = mkOption {
        type = types.attrsOf absolutePath;
        default = {};
        example = literalExpression ''
          {
            db-password = config.sops.secrets.db-password.path;  # sops-nix
            api-token = config.age.secrets.api-token.path;       # agenix
          }
        '';
        description = ''
          Secrets for the guest, as credential name → host file. systemd
          reads each file as root with `LoadCredential=` (so a root-only
          file from sops-nix or agenix works); the launcher copies it onto a
          tmpfs (`noswap`) that exists only in the VM's mount namespace,
          owned by the VM's principal, and QEMU hands it to the guest as
          fw_cfg `${vlib.fwCfgPrefix}<name>`, which systemd in the
          guest imports as a credential. Never on a command line.

          Give the path as a string: a Nix path literal would copy the
          secret into the world-readable Nix store (an assertion refuses
          store paths). Names: `^${vlib.credNameRegex}$`; at most
          ${toString (vlib.fwCfgMax - builtins.stringLength vlib.fwCfgPrefix)} bytes (the fw_cfg name limit is ${toString vlib.fwCfgMax} bytes).
        '';
      };

      principal = {
        user = mkOption {
          type = types.str;
          default = "vm-${name}";
          defaultText = literalExpression ''"vm-''${name}"'';
          description = ''
            System user the hypervisor runs as; created by this module
            (`isSystemUser`). Must not be shared with another VM.
          '';
        };
        group = mkOption {
          type = types.str;
          default = "vm-${name}";
          defaultText = literalExpression ''"vm-''${name}"'';
          description = "Primary group of {option}`principal.user`; created by this module.";
        };
        uid = mkOption {
          type = types.nullOr (types.ints.between 1 4294967294);
          default = null;
          example = 30001;
          description = ''
            Fixed uid for {option}`principal.user`, or `null` to let NixOS
            allocate one (stable across rebuilds). Must be unique.
          '';
        };
      };

      landlock = {
        mode = mkOption {
          type = types.enum ["required" "best-effort"];
          default = "required";
          description = ''
            `"required"`: refuse to start the VM when the kernel cannot
            enforce the Landlock policy. `"best-effort"`: start anyway and
            log what could not be enforced.
          '';
        };
        read = mkOption {
          type = types.listOf absolutePath;
          default = [];
          description = ''
            Extra paths the hypervisor may read (and execute), beyond what
            the launcher derives from the spec (binary, kernel, initrd,
            disks, credentials, its own directories).
          '';
        };
        write = mkOption {
          type = types.listOf absolutePath;
          default = [];
          description = ''
            Extra paths the hypervisor may write. They are also made
            writable in the unit (`ReadWritePaths=`).
          '';
        };
      };

      keepOnPurge = mkOption {
        type = types.listOf relativePath;
        default = ["identity"];
        example = ["identity" "ssh-host-keys"];
        description = ''
          Entries of the VM's state directory ({file}`/var/lib/vmwarden/<name>`)
          that `vmwarden purge <name> --keep-identity` keeps.
        '';
      };

      autostart = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Start the VM at boot (the target of {option}`vmwarden.unitPrefix`,
          `microvms.target` by default, wants it). Otherwise start it with
          `systemctl start microvm@<name>` (`<unitPrefix>@<name>`).
        '';
      };

      # -- Guest memory (docs/operating.md#guest-memory).
      memMerge = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Mark the guest's memory mergeable for kernel same-page merging
          (QEMU's `mem-merge`, cloud-hypervisor's `mergeable`). Off by
          default, unlike microvm.nix's runners: KSM lets one VM learn, by
          timing its writes, whether another VM or the host holds a page of
          the same content. Merging happens only on a host that runs KSM
          (`hardware.ksm.enable`). Not with firecracker, nor with
          cloud-hypervisor beside a virtiofs share.
        '';
      };

      hugepageMem = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Back the guest's memory with 2 MiB hugepages from the host's pool
          (microvm.nix's `hugepageMem`; QEMU, cloud-hypervisor and
          firecracker). The pool is the host's to declare, e.g.
          `boot.kernelParams = [ "hugepages=N" ]` with N at least the sum of
          these VMs' {option}`memoryMiB` / 2; the launch is refused when it
          has too few free pages. The hypervisor takes the pages through an
          anonymous hugetlb memfd, so its sandbox is given no hugetlbfs
          mount. {option}`memoryMiB` must be even.
        '';
      };

      # -- The host's own tools (docs/operating.md): microvm.nix's names.
      balloon = mkOption {
        type = types.bool;
        default = false;
        description = ''
          A virtio-balloon device (QEMU and cloud-hypervisor; microvm.nix's
          `balloon`): `vmwarden balloon <name> SIZE` inflates it to take SIZE
          MiB from the guest, and `vmwarden status` shows its size.
        '';
      };

      initialBalloonMem = mkOption {
        type = types.ints.unsigned;
        default = 0;
        description = ''
          The balloon's size at boot, in MiB taken from the guest
          (microvm.nix's `initialBalloonMem`; with {option}`balloon`). QEMU
          has no boot-time size: `vmwarden wait-ready` sets it once QEMU
          answers.
        '';
      };

      deflateOnOOM = mkOption {
        type = types.bool;
        default = true;
        description = ''
          The guest deflates the balloon when it runs out of memory
          (microvm.nix's `deflateOnOOM`; with {option}`balloon`).
        '';
      };

      console = mkOption {
        type = types.bool;
        default = false;
        description = ''
          A serial console root can attach to with `vmwarden console <name>`
          (Ctrl-] detaches; QEMU and cloud-hypervisor). The guest's serial
          output still goes to the journal. Off by default so that turning
          it on is a choice (it adds one relay process per VM and changes
          the VM's spec, which restarts it at the next switch).
        '';
      };

      devices = mkOption {
        type = types.listOf (types.submodule {
          options = {
            bus = mkOption {
              type = types.enum ["pci" "usb"];
              description = "The device's bus (microvm.nix's `devices.*.bus`); `usb` on QEMU only.";
            };
            path = mkOption {
              type = types.str;
              example = "0000:01:00.0";
              description = ''
                PCI: the address `DDDD:BB:DD.F`. USB: `vendorid=0x…,productid=0x…`
                or `hostbus=…,hostaddr=…` (microvm.nix's `devices.*.path`).
              '';
            };
            id = mkOption {
              type = types.nullOr types.str;
              default = null;
              description = "QEMU's device id (microvm.nix's `qemu.id`).";
            };
            qemuBus = mkOption {
              type = types.nullOr types.str;
              default = null;
              description = "QEMU's `bus=` (microvm.nix's `qemu.bus`), e.g. a `pcie-root-port` of {option}`extraArgs`.";
            };
            qemuProperties = mkOption {
              type = types.listOf types.str;
              default = [];
              example = ["x-vga=on"];
              description = ''
                More `vfio-pci` properties, `key=value` each (microvm.nix's
                `qemu.deviceExtraArgs`, split at `,`): only how the device
                looks to the guest (`x-vga`, `rombar`, `multifunction`,
                `addr`, `x-igd-opregion`, `x-igd-gms`, `display`,
                `x-no-mmap`), never what QEMU opens.
              '';
            };
            keepOnVfioPci = mkOption {
              type = types.bool;
              default = false;
              description = "PCI: leave the device on `vfio-pci` after the VM stops instead of giving it back to the driver it had.";
            };
          };
        });
        default = [];
        description = ''
          Host PCI and USB devices the VM holds for its life (microvm.nix's
          `devices`). The launcher checks each before anything is made (a
          PCI device's IOMMU group viable, interrupts remapped, nobody
          holding it), records the driver it had, binds it to `vfio-pci`,
          and cleanup gives it back and proves it (docs/launch-spec.md).
          A device is one VM's: two VMs naming it are refused here.
        '';
      };

      allowUnsafeInterrupts = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Hand a PCI device over on a host without interrupt remapping
          (vfio_iommu_type1's `allow_unsafe_interrupts`): the guest can then
          send the host interrupts. Refused without a PCI device.
        '';
      };

      resources = {
        cpuQuotaPercent = mkOption {
          type = types.nullOr (types.ints.between 1 102400);
          default = null;
          example = 200;
          description = "The unit's `CPUQuota=`, in percent of one CPU (200: two CPUs' time at most).";
        };
        cpuWeight = mkOption {
          type = types.nullOr (types.ints.between 1 10000);
          default = null;
          description = "The unit's `CPUWeight=` (systemd's default 100): its share of contended CPU time.";
        };
        memoryMaxMiB = mkOption {
          type = types.nullOr (types.ints.between 64 1073741824);
          default = null;
          description = ''
            The unit's `MemoryMax=` in MiB: the hypervisor, its helpers and
            the guest memory they touch. Past it the kernel's OOM killer
            ends the VM (the unit fails, cleanup runs as after any stop).
            Leave room above `memoryMiB` for the hypervisor itself.
          '';
        };
        memoryHighMiB = mkOption {
          type = types.nullOr (types.ints.between 64 1073741824);
          default = null;
          description = "The unit's `MemoryHigh=` in MiB: past it the kernel throttles and reclaims. At most `memoryMaxMiB`.";
        };
        ioWeight = mkOption {
          type = types.nullOr (types.ints.between 1 10000);
          default = null;
          description = "The unit's `IOWeight=` (systemd's default 100): its share of contended block I/O.";
        };
        tasksMax = mkOption {
          type = types.nullOr (types.ints.between 32 4194304);
          default = null;
          description = "The unit's `TasksMax=`: processes and threads of the hypervisor and its helpers.";
        };
        cpus = mkOption {
          type = types.nullOr (types.strMatching "[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*");
          default = null;
          example = "2-3";
          description = "The CPUs the VM runs on: the unit's `AllowedCPUs=` (its cgroup's cpuset) and `CPUAffinity=`.";
        };
      };

      # -- Hibernate and restore (docs/operating.md#hibernate).
      hibernate = {
        allowed = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Let `vmwarden hibernate NAME` write the guest's memory to its
            state directory and the next start restore it. Off by default:
            the snapshot holds everything the guest had in memory, its
            credentials included, on persistent disk (the credentials'
            tmpfs is `noswap`). QEMU only; not with virtiofs or 9p shares,
            a `vsock.backend = "user"` or passed-through devices.
          '';
        };
        onMismatch = mkOption {
          type = types.enum ["refuse" "cold-boot"];
          default = "refuse";
          description = ''
            What a start does when the snapshot no longer matches what the
            VM would run (its spec, hypervisor, kernel, initrd or disks
            changed): `"refuse"` (exit 78, naming what differs; the
            snapshot is kept) or `"cold-boot"` (boot, logged, and the snapshot
            discarded: a guest that ran from its disks makes it stale).
          '';
        };
      };

      registerWithMachined = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Register the VM with systemd-machined (microvm.nix's
          `registerWithMachined`): `machinectl list` and `machinectl status`
          show it, class `vm`, with its unit and the hypervisor as leader.
          The launch fails (exit 78) on a host without machined. What
          machined can then do to the VM: docs/design/threat-model.md.
        '';
      };

      restartIfChanged = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Restart the VM when a rebuild changes its spec or the unit. With
          `false`, a running VM keeps its old configuration until it is
          restarted by hand. Removing a VM from {option}`vmwarden.vms`
          always stops it.
        '';
      };
    };
  };
in {
  options.vmwarden = {
    enable = mkEnableOption ''
      vmwarden: microVMs that each run as their own system user, in their
      own mount namespace, with credentials on a per-VM noswap tmpfs, and
      whose teardown is verified after every stop'';

    package = mkOption {
      type = types.package;
      default = pkgs.vmwarden or (throw "vmwarden.package: pkgs has no `vmwarden`; import this flake's nixosModules.default (it sets the package), apply its overlays.default, or set vmwarden.package.");
      defaultText = literalExpression "vmwarden.packages.\${system}.default (set by the flake's nixosModules.default)";
      description = "Package providing `vmwarden-launch`, `vmwarden-cleanup` and `vmwarden`.";
    };

    unitPrefix = mkOption {
      type = types.enum vlib.unitPrefixes;
      default = vlib.unitNamesData.default;
      example = "vmwarden";
      description = ''
        Names of the units every VM runs under: the template
        `<unitPrefix>@.service` and its target. `"microvm"` (the default)
        gives `microvm@.service` and `microvms.target`, microvm.nix's names;
        `"vmwarden"` gives `vmwarden@.service` and `vmwarden-vms.target`,
        so microvm.nix's host module can stay on the same host while its
        VMs move over one at a time (see docs/microvm-nix.md, "Migrating").
        `vmwarden render-unit --prefix` renders the same names on hosts
        without Nix.
      '';
    };

    reapReport.enable = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Run `vmwarden reap` (a dry run: it deletes nothing) once at boot,
        before the VMs start, so leftovers of earlier runs and of removed
        VMs are reported in the journal
        (`journalctl -u vmwarden-reap-report`).
      '';
    };

    hibernateOnShutdown = {
      enable = mkEnableOption ''
        hibernation of the running VMs at the host's shutdown and their
        restore at the next boot, like libvirt-guests with managed save: at
        shutdown, `vmwarden-hibernate-on-shutdown.service` hibernates every
        running VM whose `hibernate.allowed` is true, one after another
        (`vmwarden hibernate-all`); at boot it starts the units of those
        VMs again, and each restores from its snapshot (`vmwarden
        start-hibernated`). VMs that do not allow hibernation stop as
        usual. Stopping the service by hand hibernates them at once
        (docs/operating.md#hibernate)'';
      timeout = mkOption {
        type = types.ints.positive;
        default = 300;
        example = 60;
        description = ''
          Seconds each VM's capture may take at shutdown. A VM not
          hibernated within it (or whose capture fails) is stopped
          normally, and the journal says so. The VMs are put down one after
          another, so a shutdown may wait up to this times the number of
          VMs that allow hibernation, plus their normal stops.
        '';
      };
    };

    metrics.textfile = {
      enable = mkEnableOption ''
        `vmwarden metrics` written every `interval` into node-exporter's
        textfile collector directory (`vmwarden.prom`, replaced
        atomically) by the timer `vmwarden-metrics.timer` and the oneshot
        `vmwarden-metrics.service`: every VM's state, uptime, starts, CPU,
        memory, block and network bytes, balloon and last cleanup, scraped
        with the host's node-exporter. No daemon, no port
        (docs/operating.md#metrics)'';
      directory = mkOption {
        type = types.nullOr absolutePath;
        default = vlib.nodeExporterTextfileDir config;
        defaultText = literalExpression ''
          the directory of `--collector.textfile.directory=` in
          services.prometheus.exporters.node.extraFlags, else null'';
        example = "/var/lib/prometheus-node-exporter-text-files";
        description = ''
          node-exporter's textfile collector directory. The service writes
          `vmwarden.prom` there and nothing else (its temporary name is
          `.vmwarden.prom.tmp`, which the collector's `*.prom` does not
          match). Needed when node-exporter's own flags do not name one.
        '';
      };
      interval = mkOption {
        type = types.strMatching "[1-9][0-9]*(s|min|h)";
        default = "30s";
        example = "1min";
        description = ''
          How often the figures are written: a systemd time span of whole
          seconds, minutes or hours. Each run reads every VM once, asking
          its control socket within `vmwarden status`' bounds.
        '';
      };
    };

    vms = mkOption {
      type = types.attrsOf (types.submodule vmModule);
      default = {};
      example = literalExpression ''
        {
          web = {
            vcpus = 2;
            memoryMiB = 1024;
            kernel = "''${pkgs.linuxPackages_latest.kernel}/bzImage";
            initrd = "/var/lib/vmwarden-images/web/initrd";
            disks = [ { path = "/var/lib/vmwarden/web/root.img"; } ];
            credentials.db-password = config.sops.secrets.db-password.path;
          };
        }
      '';
      description = ''
        MicroVMs, by name (`^${vlib.vmNameRegex}$`). Each becomes
        {file}`/etc/vmwarden/vms/<name>.json`, a system user and group, and
        the instance `microvm@<name>.service` of the shared template
        (`<unitPrefix>@<name>.service`, see {option}`vmwarden.unitPrefix`).
      '';
    };
  };
}
