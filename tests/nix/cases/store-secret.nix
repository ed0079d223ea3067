# A credential file in the world-readable Nix store.
{
  imports = [./base.nix];
  vmwarden.vms.web.credentials.token = "/nix/store/00000000000000000000000000000000-token";
}
