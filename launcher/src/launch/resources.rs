//! What the intent record names before any of it exists.

use std::path::Path;

use crate::config::paths::{
    API_SOCKET, CH_API_LOCK, CONSOLE_SOCKET, CONTROL_DIR, CREDENTIALS_DIR, FIRECRACKER_CONFIG,
    LAUNCHED_SPEC_FILE, QMP_SOCKET,
};
use crate::config::spec::{HypervisorKind, Spec};
use crate::instance::intent::Resource;
use crate::launch::{helpers, netns, volumes};

/// Every resource this launch will create, in creation order: what the
/// intent record names before any of it exists (the launched spec copy,
/// the state dir, the control dir and its socket — and firecracker's config
/// file —, the credential mount point and its private tmpfs, each tap or
/// macvtap, or
/// for firecracker its network namespace and each link into it).
/// Pure: cleanup and reap trust this list, so it is unit-tested.
pub fn planned_resources(
    spec: &Spec,
    spec_path: &Path,
    runtime_dir: &Path,
    state_dir: &Path,
) -> Vec<Resource> {
    let control = runtime_dir.join(CONTROL_DIR);
    let creds = runtime_dir.join(CREDENTIALS_DIR);
    let kind = spec.hypervisor.kind;
    let mut resources = vec![
        Resource::LaunchedSpec {
            path: runtime_dir.join(LAUNCHED_SPEC_FILE),
            source: spec_path.to_path_buf(),
        },
        Resource::StateDir {
            path: state_dir.to_path_buf(),
        },
        Resource::RuntimeDir {
            path: control.clone(),
        },
        Resource::RuntimeFile {
            path: match kind {
                HypervisorKind::Qemu => control.join(QMP_SOCKET),
                _ => control.join(API_SOCKET),
            },
        },
    ];
    // The console relay's socket (root's); the relay itself runs as the
    // principal in the instance's cgroup, which liveness already asks.
    if spec.console {
        resources.push(Resource::RuntimeFile {
            path: control.join(CONSOLE_SOCKET),
        });
    }
    // Each helper by its entry's name, with the socket the hypervisor
    // connects to; its other sockets are runtime files.
    for h in helpers::plan(spec, &control) {
        let mut sockets = h.sockets.into_iter();
        resources.push(Resource::Helper {
            helper: h.kind.as_str().to_string(),
            tag: h.tag,
            socket: sockets.next(),
        });
        resources.extend(sockets.map(|path| Resource::RuntimeFile { path }));
    }
    match kind {
        HypervisorKind::Firecracker => resources.push(Resource::RuntimeFile {
            path: control.join(FIRECRACKER_CONFIG),
        }),
        HypervisorKind::CloudHypervisor => resources.push(Resource::RuntimeFile {
            path: control.join(CH_API_LOCK),
        }),
        HypervisorKind::Qemu => {}
    }
    resources.extend([
        Resource::RuntimeDir {
            path: creds.clone(),
        },
        Resource::PrivateMount {
            path: creds,
            fstype: "tmpfs".into(),
        },
    ]);
    // Images to create: the temporary name is what a killed launch leaves
    // (cleanup removes it); the image itself is never cleanup's.
    resources.extend(
        spec.disks
            .iter()
            .filter(|d| d.create.is_some())
            .filter_map(|d| {
                Some(Resource::CreatedImage {
                    path: d.path.clone(),
                    temp: volumes::temp_path(&d.path)?,
                })
            }),
    );
    // Firecracker's interfaces live in a network namespace of its own
    // (launch::netns): the namespace, then each link (its tap inside).
    if kind == HypervisorKind::Firecracker && !spec.interfaces.is_empty() {
        resources.push(Resource::NetNamespace {});
        resources.extend(
            spec.interfaces
                .iter()
                .enumerate()
                .map(|(i, n)| Resource::NsLink {
                    name: n.tap.to_string(),
                    bridge: n.bridge.as_ref().map(|b| b.to_string()),
                    peer: netns::uplink_name(i),
                }),
        );
        return resources;
    }
    resources.extend(spec.interfaces.iter().map(|n| match n.macvtap() {
        Some(m) => Resource::Macvtap {
            name: n.tap.to_string(),
            link: m.link.clone(),
            mode: m.mode.as_str().to_string(),
        },
        None => Resource::Tap {
            name: n.tap.to_string(),
            bridge: n.bridge.as_ref().map(|b| b.to_string()),
        },
    }));
    resources
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::tests::{base_spec, spec_of};
    use std::path::PathBuf;

    #[test]
    fn the_intent_record_names_every_resource_in_creation_order() {
        let mut v = base_spec("qemu");
        v["interfaces"] = serde_json::json!([{ "tap": "vmw-web0", "bridge": "br0" }]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let p = PathBuf::from;
        assert_eq!(
            got,
            vec![
                Resource::LaunchedSpec {
                    path: p("/run/vmwarden/web/launched-spec.json"),
                    source: p("/etc/vmwarden/vms/web.json"),
                },
                Resource::StateDir {
                    path: p("/var/lib/vmwarden/web")
                },
                Resource::RuntimeDir {
                    path: p("/run/vmwarden/web/control")
                },
                Resource::RuntimeFile {
                    path: p("/run/vmwarden/web/control/qmp.sock")
                },
                Resource::RuntimeDir {
                    path: p("/run/vmwarden/web/credentials")
                },
                Resource::PrivateMount {
                    path: p("/run/vmwarden/web/credentials"),
                    fstype: "tmpfs".into()
                },
                Resource::Tap {
                    name: "vmw-web0".into(),
                    bridge: Some("br0".into())
                },
            ]
        );
    }

    #[test]
    fn a_macvtap_is_named_with_its_link_and_mode_before_it_exists() {
        let mut v = base_spec("qemu");
        v["interfaces"] = serde_json::json!([
            { "tap": "vmw-web0", "bridge": "br0" },
            { "tap": "vmw-web1", "type": "macvtap", "macvtap": { "link": "enp3s0", "mode": "bridge" } }
        ]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let n = got.len();
        assert_eq!(
            got[n - 2..],
            [
                Resource::Tap {
                    name: "vmw-web0".into(),
                    bridge: Some("br0".into())
                },
                Resource::Macvtap {
                    name: "vmw-web1".into(),
                    link: "enp3s0".into(),
                    mode: "bridge".into(),
                },
            ]
        );
    }

    #[test]
    fn a_created_image_is_recorded_with_its_temporary_name_before_the_taps() {
        let mut v = base_spec("qemu");
        v["disks"] = serde_json::json!([
            { "path": "/var/lib/vmwarden/web/root.img" },
            { "path": "/var/lib/vmwarden/web/data.img", "create": { "size_mib": 8 } }
        ]);
        v["interfaces"] = serde_json::json!([{ "tap": "vmw-web0" }]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let n = got.len();
        assert_eq!(
            got[n - 2..],
            [
                Resource::CreatedImage {
                    path: PathBuf::from("/var/lib/vmwarden/web/data.img"),
                    temp: PathBuf::from("/var/lib/vmwarden/web/.data.img.vmwarden-new"),
                },
                Resource::Tap {
                    name: "vmw-web0".into(),
                    bridge: None
                },
            ]
        );
    }

    #[test]
    fn firecracker_records_its_network_namespace_and_each_link_into_it() {
        let mut v = base_spec("firecracker");
        v["interfaces"] = serde_json::json!([
            { "tap": "vmw-web0", "bridge": "br0" },
            { "tap": "vmw-web1" }
        ]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let n = got.len();
        assert_eq!(
            got[n - 3..],
            [
                Resource::NetNamespace {},
                Resource::NsLink {
                    name: "vmw-web0".into(),
                    bridge: Some("br0".into()),
                    peer: "uplink0".into(),
                },
                Resource::NsLink {
                    name: "vmw-web1".into(),
                    bridge: None,
                    peer: "uplink1".into(),
                },
            ]
        );
        assert!(!got.iter().any(|r| matches!(r, Resource::Tap { .. })));
    }

    #[test]
    fn passt_is_named_before_it_exists_with_no_socket() {
        let mut v = base_spec("qemu");
        v["user_network"] = serde_json::json!({ "binary": "/usr/bin/passt", "id": "qemu" });
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let helpers: Vec<_> = got
            .iter()
            .filter(|r| matches!(r, Resource::Helper { .. }))
            .collect();
        assert_eq!(
            helpers,
            [&Resource::Helper {
                helper: "passt".into(),
                tag: Some("qemu".into()),
                socket: None,
            }]
        );
        // Before the credential mount, like every helper.
        let at = |f: &dyn Fn(&Resource) -> bool| got.iter().position(f).unwrap();
        assert!(
            at(&|r| matches!(r, Resource::Helper { .. }))
                < at(&|r| matches!(r, Resource::PrivateMount { .. }))
        );
    }

    /// The runtime files the intent record names for a `kind` spec.
    fn runtime_files(kind: &str) -> Vec<PathBuf> {
        planned_resources(
            &spec_of(base_spec(kind)),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        )
        .into_iter()
        .filter_map(|r| match r {
            Resource::RuntimeFile { path } => Some(path),
            _ => None,
        })
        .collect()
    }

    #[test]
    fn firecracker_records_its_api_socket_and_config_file() {
        assert_eq!(
            runtime_files("firecracker"),
            vec![
                PathBuf::from("/run/vmwarden/web/control/api.sock"),
                PathBuf::from("/run/vmwarden/web/control/firecracker.json"),
            ]
        );
    }

    #[test]
    fn cloud_hypervisor_records_its_api_socket_and_lock() {
        assert_eq!(
            runtime_files("cloud-hypervisor"),
            vec![
                PathBuf::from("/run/vmwarden/web/control/api.sock"),
                PathBuf::from("/run/vmwarden/web/control/api.sock.lock"),
            ]
        );
    }
}
