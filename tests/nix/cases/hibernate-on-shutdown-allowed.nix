# vmwarden.hibernateOnShutdown with a VM that allows hibernation: no warning.
{
  imports = [./hibernate-on-shutdown.nix];
  vmwarden.vms.web.hibernate.allowed = true;
}
