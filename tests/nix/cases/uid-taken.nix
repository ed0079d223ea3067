# A VM uid that another (non-VM) user already has.
{
  imports = [./base.nix];
  vmwarden.vms.web.principal.uid = 1000;
  users.users.alice = {
    isNormalUser = true;
    uid = 1000;
    group = "users";
  };
}
