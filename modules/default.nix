# vmwarden's NixOS module. Import it through the flake
# (`vmwarden.nixosModules.default`, which also sets `vmwarden.package`) or
# directly, with `vmwarden.package` set. See docs/nixos.md.
{
  imports = [
    ./options.nix
    ./assertions.nix
    ./host.nix
  ];
}
