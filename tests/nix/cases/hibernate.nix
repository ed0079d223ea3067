# vmwarden.vms.<name>.hibernate: allowed, cold boot on a mismatch; the spec
# carries it (tests/nix/golden/hibernate/), a VM without it does not.
{
  imports = [./base.nix];
  vmwarden.vms.web.hibernate = {
    allowed = true;
    onMismatch = "cold-boot";
  };
}
