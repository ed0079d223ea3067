//! `render-unit --hibernate-on-shutdown`: vmwarden-hibernate-on-shutdown.service
//! from its data, with the deadline per VM (`@timeout@`).

use super::{entries, render, unit_data, unit_safe_dir, RenderUnitArgs, UnitError, UnitNames};

/// `units/vmwarden-hibernate-on-shutdown.service.toml`, compiled in.
pub const HIBERNATE_ON_SHUTDOWN_DATA: &str =
    include_str!("../../../units/vmwarden-hibernate-on-shutdown.service.toml");
/// Seconds each VM's capture may take at shutdown, by default.
pub const DEFAULT_HIBERNATE_TIMEOUT: u32 = 300;
/// Stands for that deadline in the unit's data.
const TIMEOUT_PLACEHOLDER: &str = "@timeout@";

/// The unit's text.
pub(super) fn render_unit(args: &RenderUnitArgs, names: &UnitNames) -> Result<String, UnitError> {
    let (p, t) = (names.prefix(), names.target());
    let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
    let file = "vmwarden-hibernate-on-shutdown.service.toml";
    let data = unit_data(args, file, HIBERNATE_ON_SHUTDOWN_DATA)?
        .replace(TIMEOUT_PLACEHOLDER, &args.hibernate_timeout.to_string());
    Ok(render(
        &format!(
            "vmwarden-hibernate-on-shutdown.service: hibernate the VMs that allow it at\n\
             # shutdown, start them again (restored) at boot. Install as\n\
             # /etc/systemd/system/vmwarden-hibernate-on-shutdown.service, then\n\
             # `systemctl enable --now vmwarden-hibernate-on-shutdown.service`; for VMs\n\
             # not wanted by {t}, add After={p}@NAME.service (`systemctl edit`)."
        ),
        &entries(file, &data, Some(&bin), names)?,
    ))
}
