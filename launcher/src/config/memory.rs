//! The spec's guest-memory fields: `mem_merge` (kernel same-page merging)
//! and `hugepage_mem` (guest memory from the host's hugepage pool).
//! Checked with the rest of the spec by [`Spec::validate`]; the
//! per-hypervisor refusals come from [`crate::config::capabilities`].
//!
//! Both are off unless the spec asks. KSM lets one VM learn, by timing
//! its own writes, whether another VM (or the host) holds a page with the
//! same content (docs/design/threat-model.md, "Guest memory"); hugepages
//! are taken from a pool the host declares (`vm.nr_hugepages`), through an
//! anonymous `memfd_create(MFD_HUGETLB)`, so the sandbox grants no
//! hugetlbfs mount and no path at all.

use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::spec::{HypervisorKind, ShareProto, Spec, SpecError};

/// The hugepage size `hugepage_mem` takes, in MiB: x86-64's 2 MiB pages,
/// the size every hypervisor here defaults to.
pub const HUGEPAGE_MIB: u64 = 2;

impl Spec {
    pub(crate) fn validate_memory(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let kind = self.hypervisor.kind;
        if self.mem_merge {
            if let Some(r) = capabilities::refusal(kind, Feature::MemMerge) {
                return Err(bad(r.field, r.reason.to_string()));
            }
            let virtiofs = self.shares.iter().any(|s| s.proto == ShareProto::Virtiofs);
            if kind == HypervisorKind::CloudHypervisor && virtiofs {
                return Err(bad(
                    "mem_merge",
                    "is true, but cloud-hypervisor cannot merge memory it shares with virtiofsd \
                     (its `mergeable` and `shared` exclude each other); drop the virtiofs shares or mem_merge"
                        .to_string(),
                ));
            }
        }
        if self.hugepage_mem && !self.memory_mib.is_multiple_of(HUGEPAGE_MIB) {
            return Err(bad(
                "memory_mib",
                format!(
                    "is {} MiB, but hugepage_mem backs the guest with {HUGEPAGE_MIB} MiB pages; \
                     give a multiple of {HUGEPAGE_MIB}",
                    self.memory_mib
                ),
            ));
        }
        // Hibernation puts the guest's memory on disk (config/hibernate.rs).
        super::hibernate::check(self, path)
    }

    /// The host's hugepages the guest takes: `memory_mib` in
    /// [`HUGEPAGE_MIB`] pages (0 without `hugepage_mem`).
    pub fn hugepages_needed(&self) -> u64 {
        if self.hugepage_mem {
            self.memory_mib / HUGEPAGE_MIB
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::spec::tests::{base, check};
    use crate::config::spec::Spec;
    use serde_json::json;

    #[test]
    fn both_default_off_and_are_left_out_when_off() {
        let v = base();
        let spec: Spec = serde_json::from_value(v).unwrap();
        assert!(!spec.mem_merge && !spec.hugepage_mem);
        assert_eq!(spec.hugepages_needed(), 0);
        let back = serde_json::to_value(&spec).unwrap();
        for f in ["mem_merge", "hugepage_mem"] {
            assert!(back.get(f).is_none(), "{f} rendered: {back}");
        }
    }

    #[test]
    fn firecracker_refuses_mem_merge_by_name_and_takes_hugepages() {
        let mut v = base();
        v["hypervisor"]["kind"] = json!("firecracker");
        v["mem_merge"] = json!(true);
        let e = check(v.clone()).unwrap_err().to_string();
        assert!(
            e.contains("field `mem_merge`") && e.contains("firecracker"),
            "{e}"
        );
        v["mem_merge"] = json!(false);
        v["hugepage_mem"] = json!(true);
        check(v).unwrap();
    }

    #[test]
    fn cloud_hypervisor_refuses_mem_merge_beside_a_virtiofs_share() {
        let mut v = base();
        v["hypervisor"]["kind"] = json!("cloud-hypervisor");
        v["mem_merge"] = json!(true);
        check(v.clone()).unwrap();
        v["shares"] =
            json!([{ "tag": "s", "source": "/srv/s", "proto": "virtiofs", "read_only": true }]);
        v["virtiofsd"] = json!({ "binary": "/usr/libexec/virtiofsd" });
        let e = check(v).unwrap_err().to_string();
        assert!(
            e.contains("field `mem_merge`") && e.contains("virtiofs"),
            "{e}"
        );
    }

    #[test]
    fn hugepage_mem_needs_whole_pages() {
        let mut v = base();
        v["hugepage_mem"] = json!(true);
        v["memory_mib"] = json!(257);
        let e = check(v.clone()).unwrap_err().to_string();
        assert!(
            e.contains("field `memory_mib`") && e.contains("multiple of 2"),
            "{e}"
        );
        v["memory_mib"] = json!(256);
        let spec: Spec = serde_json::from_value(v.clone()).unwrap();
        check(v).unwrap();
        assert_eq!(spec.hugepages_needed(), 128);
    }
}
