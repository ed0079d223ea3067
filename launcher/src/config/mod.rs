//! Configuration: the launch spec, the names it may contain, and the roots
//! every path is resolved against. The bottom layer: it imports no other part.

pub mod capabilities;
pub mod devices;
pub mod extra_args;
pub mod files;
pub mod hibernate;
pub mod host_tools;
pub mod macvtap;
pub mod memory;
pub mod names;
pub mod paths;
pub mod rawpath;
pub mod reboot;
pub mod resources;
pub mod rules;
pub mod shares;
pub mod spec;
pub mod text;
pub mod user_net;
pub mod validation;
pub mod validation_devices;
pub mod validation_macvtap;
pub mod validation_user_net;
pub mod vmm_notify;
