# A guest that boots from its store disk (no /nix/store share), with
# volumes: an auto-created /var (relative image, serial), a read-only data
# image elsewhere, created by hand, and a qcow2 one.
{
  networking.hostName = "db";
  microvm = {
    mem = 2048;
    volumes = [
      {
        image = "var.img";
        mountPoint = "/var";
        size = 4096;
        serial = "var";
      }
      {
        image = "/srv/images/dataset.img";
        mountPoint = "/data";
        readOnly = true;
        autoCreate = false;
      }
      {
        image = "scratch.qcow2";
        mountPoint = "/scratch";
        imageType = "qcow2";
        autoCreate = false;
      }
    ];
  };
}
