# A stand-in for microvm.nix's guest module (microvm.nixosModules.microvm),
# written for vmwarden's tests from microvm.nix's
# nixos-modules/microvm/{options,system,store-disk,vsock-ssh,mounts}.nix at commit
# 71beea0076cd46dafcee97a5a2e7d00cbba5bd2f (the version docs/microvm-nix.md
# was read from; not vendored): every option of `config.microvm` with its
# name, type and default, and the values the module itself computes
# (kernelParams with init= and regInfo=, the store disk), so a guest
# evaluated here has the shape of a real one. Packages are stub-pkgs fakes;
# the few NixOS options the defaults read are declared below.
{
  config,
  lib,
  pkgs,
  ...
}: let
  inherit (lib) mkOption types;
  cfg = config.microvm;
  hostName = config.networking.hostName;
  opt = type: default: mkOption {inherit type default;};
  req = type: mkOption {inherit type;};
  fake = name:
    pkgs.writeText name "stand-in for ${name}"
    // {
      inherit name;
      pname = name;
    };

  volume = types.submodule {
    options = {
      image = req types.str;
      serial = opt (types.nullOr types.str) null;
      direct = opt types.bool false;
      readOnly = opt types.bool false;
      label = opt (types.nullOr types.str) null;
      mountPoint = req (types.nullOr types.path);
      size = req types.int;
      autoCreate = opt types.bool true;
      mkfsExtraArgs = opt (types.listOf types.str) [];
      fsType = opt types.str "ext4";
      imageType = opt (types.enum ["raw" "qcow2" "vhd" "vhdx"]) "raw";
    };
  };
  interface = types.submodule {
    options = {
      type = req (types.enum ["user" "tap" "macvtap" "bridge"]);
      id = req types.str;
      macvtap.link = req types.str;
      macvtap.mode = req (types.enum ["private" "vepa" "bridge" "passthru" "source"]);
      bridge = opt (types.nullOr types.str) null;
      mac = req types.str;
      tap.vhost = opt types.bool false;
    };
  };
  share = types.submodule ({config, ...}: {
    options = {
      tag = req types.str;
      socket = opt (types.nullOr types.str) (
        if config.proto == "virtiofs"
        then "${hostName}-virtiofs-${config.tag}.sock"
        else null
      );
      source = req types.nonEmptyStr;
      securityModel = opt (types.enum ["passthrough" "none" "mapped" "mapped-file"]) "none";
      mountPoint = req types.path;
      proto = opt (types.enum ["9p" "virtiofs"]) "9p";
      readOnly = opt types.bool false;
      cache = opt (types.enum ["auto" "always" "metadata" "never"]) "auto";
      posixAcl = opt types.bool true;
      extraArgs = opt (types.listOf types.str) [];
    };
  });
  device = types.submodule {
    options = {
      bus = req (types.enum ["pci" "usb"]);
      path = req types.str;
      qemu.id = opt (types.nullOr types.str) null;
      qemu.bus = opt (types.nullOr types.str) null;
      qemu.deviceExtraArgs = opt (types.nullOr types.str) null;
    };
  };
  forward = types.submodule {
    options = {
      from = opt (types.enum ["host" "guest"]) "host";
      proto = opt (types.enum ["tcp" "udp"]) "tcp";
      host.address = opt types.str "";
      host.port = req types.port;
      guest.address = opt types.str "";
      guest.port = req types.port;
    };
  };
  rootPort = types.submodule {
    options = {
      id = req types.str;
      bus = opt (types.nullOr types.str) null;
      chassis = opt (types.nullOr types.int) null;
      slot = opt (types.nullOr types.str) null;
      addr = opt (types.nullOr types.str) null;
    };
  };
  hash = builtins.hashString "sha256" "microvm.nix:${hostName}";
  hs = offset: len: builtins.substring offset len hash;
  regInfo = fake "closure-info";
in {
  options = {
    # ---------------------------------------------------------- NixOS
    networking.hostName = opt types.str "nixos";
    boot.kernelPackages = opt types.raw {kernel = pkgs.linux;};
    boot.kernelParams = opt (types.listOf types.str) [];
    fileSystems = opt (types.attrsOf (types.submodule {
      options = {
        device = req types.str;
        fsType = req types.str;
        options = opt (types.listOf types.str) [];
        neededForBoot = opt types.bool false;
      };
    })) {};
    nix.enable = opt types.bool true;
    system.build = opt (types.attrsOf types.raw) {};
    system.boot.loader.initrdFile = opt types.str "initrd";

    # ---------------------------------------------------------- microvm
    microvm = {
      guest.enable = opt types.bool true;
      optimize.enable = opt types.bool true;
      cpu = opt (types.nullOr types.str) null;
      hypervisor = opt (types.enum ["qemu" "cloud-hypervisor" "firecracker" "crosvm" "kvmtool" "stratovirt" "alioth" "vfkit"]) "qemu";
      preStart = opt types.lines "";
      extraArgsScript = opt (types.nullOr types.str) null;
      socket = opt (types.nullOr types.str) "${hostName}.sock";
      user = opt (types.nullOr types.str) null;
      kernel = opt types.package config.boot.kernelPackages.kernel;
      initrdPath = opt types.path "${config.system.build.initialRamdisk}/${config.system.boot.loader.initrdFile}";
      vcpu = opt types.ints.positive 1;
      mem = opt types.ints.positive 512;
      hugepageMem = opt types.bool false;
      hotplugMem = opt types.ints.unsigned 0;
      hotpluggedMem = opt types.ints.unsigned cfg.hotplugMem;
      balloon = opt types.bool false;
      initialBalloonMem = opt types.ints.unsigned 0;
      deflateOnOOM = opt types.bool true;
      forwardPorts = opt (types.listOf forward) [];
      volumes = opt (types.listOf volume) [];
      interfaces = opt (types.listOf interface) [];
      shares = opt (types.listOf share) [];
      devices = opt (types.listOf device) [];
      vsock.cid = opt (types.nullOr types.int) null;
      vsock.ssh.enable = opt types.bool false;
      registerWithMachined = opt types.bool false;
      machineId = opt (types.nullOr types.str) (builtins.concatStringsSep "-" [(hs 0 8) (hs 8 4) (hs 12 4) (hs 16 4) (hs 20 12)]);
      kernelParams = req (types.listOf types.str);
      storeOnDisk = opt types.bool (!lib.any ({source, ...}: source == "/nix/store") cfg.shares);
      registerClosure = opt types.bool cfg.guest.enable;
      writableStoreOverlay = opt (types.nullOr types.str) null;
      graphics = {
        enable = opt types.bool false;
        crosvmPackage = opt types.package (fake "crosvm");
        backend = opt (types.enum ["gtk" "cocoa" "headless"]) "gtk";
        socket = opt types.str "${hostName}-gpu.sock";
        vulkan = opt (types.nullOr (types.enum ["venus" "drm_native_context"])) null;
        hostmem = opt types.str "256M";
      };
      vmHostPackages = opt types.raw pkgs;
      qemu = {
        machine = req types.str;
        machineOpts = opt (types.nullOr (types.attrsOf types.str)) null;
        extraArgs = opt (types.listOf types.str) [];
        serialConsole = opt types.bool true;
        pcieRootPorts = opt (types.listOf rootPort) [];
        package = opt types.package pkgs.qemu_kvm;
      };
      alioth.package = opt types.package (fake "alioth");
      cloud-hypervisor = {
        platformOEMStrings = opt (types.listOf types.str) [];
        extraArgs = opt (types.listOf types.str) [];
        package = opt types.package pkgs.cloud-hypervisor;
      };
      crosvm = {
        extraArgs = opt (types.listOf types.str) [];
        pivotRoot = opt (types.nullOr types.str) null;
        package = opt types.package (fake "crosvm");
      };
      firecracker = {
        cpu = opt (types.nullOr types.attrs) null;
        driveIoEngine = opt (types.enum ["Async" "Sync"]) "Async";
        extraArgs = opt (types.listOf types.str) [];
        extraConfig = opt (types.attrsOf types.anything) {};
        package = opt types.package pkgs.firecracker;
      };
      kvmtool.package = opt types.package (fake "kvmtool");
      stratovirt.package = opt types.package (fake "stratovirt");
      vfkit = {
        extraArgs = opt (types.listOf types.str) [];
        logLevel = opt (types.nullOr (types.enum ["debug" "info" "error"])) "info";
        package = opt types.package (fake "vfkit");
        rosetta.enable = opt types.bool false;
        rosetta.install = opt types.bool false;
        rosetta.ignoreIfMissing = opt types.bool false;
      };
      prettyProcnames = opt types.bool true;
      virtiofsd = {
        inodeFileHandles = opt (types.nullOr (types.enum ["never" "prefer" "mandatory"])) "prefer";
        threadPoolSize = opt (types.oneOf [types.str types.ints.unsigned]) "`nproc`";
        group = opt (types.nullOr types.str) "kvm";
        extraArgs = opt (types.listOf types.str) [];
        package = opt types.package pkgs.virtiofsd;
      };
      # Outputs of the module (the runner packages), not inputs.
      runner = opt (types.attrsOf types.package) {};
      declaredRunner = opt types.package (fake "microvm-run");
      binScripts = opt (types.attrsOf types.lines) {};
      storeDiskType = req (types.enum ["squashfs" "erofs"]);
      storeDiskErofsFlags = opt (types.listOf types.str) ["-zlz4hc" "-Eztailpacking" "-Efragments"];
      storeDiskSquashfsFlags = opt (types.listOf types.str) ["-c" "zstd" "-j" "$NIX_BUILD_CORES"];
      storeDisk = req types.path;
      systemSymlink = opt types.bool (!cfg.storeOnDisk);
      credentialFiles = opt (types.attrsOf types.path) {};
    };
  };

  config = lib.mkMerge [
    {
      system.build = {
        toplevel = fake "nixos-system-${hostName}";
        initialRamdisk = fake "initrd-linux";
      };
      microvm.qemu.machine = lib.mkDefault (
        if pkgs.stdenv.hostPlatform.system == "aarch64-linux"
        then "virt"
        else "microvm"
      );
    }
    # mounts.nix: a file system per share, with microvm.nix's options
    # (no nosuid or nodev among them)
    {
      fileSystems = builtins.listToAttrs (map (s: {
          name = s.mountPoint;
          value = {
            device = s.tag;
            fsType = s.proto;
            options =
              {
                "virtiofs" = ["defaults" "x-systemd.after=systemd-modules-load.service"];
                "9p" = ["trans=virtio" "version=9p2000.L" "msize=65536" "x-systemd.after=systemd-modules-load.service"];
              }
              .${
                s.proto
              };
            neededForBoot = s.source == "/nix/store";
          };
        })
        cfg.shares);
    }
    # system.nix
    (lib.mkIf cfg.guest.enable {
      microvm.kernelParams = config.boot.kernelParams ++ ["init=${config.system.build.toplevel}/init"];
    })
    # store-disk.nix
    (lib.mkIf (cfg.guest.enable && cfg.storeOnDisk) {
      microvm.storeDiskType = lib.mkDefault "erofs";
      microvm.storeDisk = fake "microvm-store-disk.${cfg.storeDiskType}";
    })
    (lib.mkIf (cfg.registerClosure && config.nix.enable) {
      microvm.kernelParams = ["regInfo=${regInfo}/registration"];
    })
  ];
}
