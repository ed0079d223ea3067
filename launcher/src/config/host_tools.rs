//! The spec's fields for the host's own tools: `balloon`, `console` and
//! `register_with_machined` (what `machinectl`, `vmwarden console` and
//! `vmwarden balloon` need). Checked with the rest of the spec by
//! [`Spec::validate`]; the per-hypervisor refusals come from
//! [`crate::config::capabilities`].

use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::spec::{Spec, SpecError, MIN_MEMORY_MIB};

impl Spec {
    pub(crate) fn validate_host_tools(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let kind = self.hypervisor.kind;
        if let Some(b) = &self.balloon {
            if let Some(r) = capabilities::refusal(kind, Feature::Balloon) {
                return Err(bad(r.field, r.reason.to_string()));
            }
            if b.initial_mib > self.max_balloon_mib() {
                return Err(bad(
                    "balloon.initial_mib",
                    format!(
                        "is {} MiB, but the guest must keep at least {MIN_MEMORY_MIB} MiB of its memory_mib {}; \
                         at most {} MiB",
                        b.initial_mib,
                        self.memory_mib,
                        self.max_balloon_mib()
                    ),
                ));
            }
        }
        if self.console {
            if let Some(r) = capabilities::refusal(kind, Feature::Console) {
                return Err(bad(r.field, r.reason.to_string()));
            }
        }
        Ok(())
    }

    /// The largest balloon the guest can be given: all its memory but
    /// [`MIN_MEMORY_MIB`] (`vmwarden balloon` refuses more, by this number).
    pub fn max_balloon_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(MIN_MEMORY_MIB)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::spec::tests::{base, check};
    use crate::config::spec::Spec;
    use serde_json::json;

    #[test]
    fn a_balloon_larger_than_the_guest_is_refused_by_its_field() {
        let mut v = base();
        v["memory_mib"] = json!(256);
        v["balloon"] = json!({"initial_mib": 241});
        let e = check(v.clone()).unwrap_err().to_string();
        assert!(e.contains("field `balloon.initial_mib`"), "{e}");
        assert!(e.contains("at most 240 MiB"), "{e}");
        v["balloon"] = json!({"initial_mib": 240, "deflate_on_oom": false});
        check(v.clone()).unwrap();
    }

    #[test]
    fn firecracker_refuses_balloon_and_console_by_name() {
        let mut v = base();
        v["hypervisor"]["kind"] = json!("firecracker");
        v["balloon"] = json!({});
        let e = check(v.clone()).unwrap_err().to_string();
        assert!(
            e.contains("field `balloon`") && e.contains("firecracker"),
            "{e}"
        );
        v.as_object_mut().unwrap().remove("balloon");
        v["console"] = json!(true);
        let e = check(v.clone()).unwrap_err().to_string();
        assert!(
            e.contains("field `console`") && e.contains("firecracker"),
            "{e}"
        );
        v["console"] = json!(false);
        v["register_with_machined"] = json!(true);
        check(v.clone()).unwrap();
    }

    #[test]
    fn the_new_fields_default_off_and_are_left_out_when_off() {
        let v = base();
        let spec: Spec = serde_json::from_value(v.clone()).unwrap();
        assert!(spec.balloon.is_none() && !spec.console && !spec.register_with_machined);
        let back = serde_json::to_value(&spec).unwrap();
        for f in ["balloon", "console", "register_with_machined"] {
            assert!(back.get(f).is_none(), "{f} rendered: {back}");
        }
        let mut v = base();
        v["balloon"] = json!({});
        let spec: Spec = serde_json::from_value(v).unwrap();
        let b = spec.balloon.unwrap();
        assert_eq!((b.initial_mib, b.deflate_on_oom), (0, true));
    }
}
