//! The wire between a VM's own network namespace and the host: a veth pair
//! (one end in each namespace) and, inside, tc redirects between the inner
//! end and the VM's tap, so that every frame the tap sends leaves by the
//! veth and every frame the veth receives goes to the tap. The namespace's
//! own stack takes no part: both inner devices get no IPv6 address (so it
//! sends nothing on them) and the redirects steal every frame before it
//! could see one. This is the pair Kata Containers calls "tcfilter".
//!
//! Each request acts in the network namespace its [`Rtnl`] socket was
//! opened in (a netlink socket keeps its namespace), so the launcher opens
//! one before it enters the VM's namespace and one after.

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoKind, InfoVeth, LinkAttribute,
    LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
    TcFilterU32Option, TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key,
    TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Result, Rtnl};

/// `ETH_P_ALL` (include/uapi/linux/if_ether.h): every protocol.
const ETH_P_ALL: u16 = 0x0003;
/// The one filter's priority on each ingress.
const FILTER_PRIO: u32 = 1;
/// The ingress qdisc's handle, `ffff:`.
const INGRESS_HANDLE: TcHandle = TcHandle {
    major: 0xffff,
    minor: 0,
};

/// The mark (a link's alias) on the host end of a link into a VM's own
/// network namespace, naming the instance that made it: its intent
/// record's `instance_id`, 128 random bits. Teardown deletes such a link
/// only when its mark is that of the record it works from: another set of
/// roots (another installation, `unitPrefix`) may run a VM whose tap has
/// the same name.
pub fn link_mark(instance_id: &str) -> String {
    format!("vmwarden instance {instance_id}")
}

impl Rtnl {
    /// A veth pair: `name` in this socket's namespace and `peer` in the
    /// network namespace of process `peer_ns_pid` (the caller itself, in
    /// the VM's namespace). `NLM_F_EXCL`: an existing `name` is an error,
    /// never reused.
    pub fn create_veth(&mut self, name: &str, peer: &str, peer_ns_pid: u32) -> Result<()> {
        let mut inner = LinkMessage::default();
        inner
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        inner.attributes.push(LinkAttribute::NetNsPid(peer_ns_pid));
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(inner))),
        ]));
        self.request(
            name,
            "RTM_NEWLINK (veth)",
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(|_| ())
    }

    /// Set link `index`'s alias (`IFLA_IFALIAS`, `/sys/class/net/NAME/ifalias`)
    /// to `alias`: the mark that says which instance made it ([`link_mark`]).
    /// The kernel ignores an alias in the `RTM_NEWLINK` that creates a veth,
    /// so it is set by itself, right after.
    pub fn set_alias(&mut self, name: &str, index: u32, alias: &str) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.request(
            name,
            "RTM_SETLINK (alias)",
            RouteNetlinkMessage::SetLink(m),
            0,
        )
        .map(|_| ())
    }

    /// Turn IPv6 address generation off on link `index`, then bring it up:
    /// with no address the namespace's stack sends nothing on it (no
    /// duplicate address detection, router solicitation or multicast
    /// listener report). Two requests: the mode must hold before the link
    /// goes up, when the kernel would make the address.
    pub fn up_silent(&mut self, name: &str, index: u32) -> Result<()> {
        self.up_without_address(name, index, LinkFlags::empty())
    }

    /// [`Rtnl::up_silent`] with `extra` link flags set together with
    /// `IFF_UP` (a macvtap's `IFF_ALLMULTI`).
    pub(crate) fn up_without_address(
        &mut self,
        name: &str,
        index: u32,
        extra: LinkFlags,
    ) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
            )]));
        self.request(
            name,
            "RTM_SETLINK (addrgenmode none)",
            RouteNetlinkMessage::SetLink(m),
            0,
        )?;
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = LinkFlags::Up | extra;
        m.header.change_mask = LinkFlags::Up | extra;
        self.request(name, "RTM_SETLINK (up)", RouteNetlinkMessage::SetLink(m), 0)
            .map(|_| ())
    }

    /// Every frame that arrives on link `from` leaves by link `to`: an
    /// ingress qdisc on `from` and one u32 filter matching everything
    /// (`match u32 0 0`) whose action is `mirred egress redirect` to `to`.
    /// `what` names the pair in errors.
    pub fn redirect_all(&mut self, what: &str, from: u32, to: u32) -> Result<()> {
        let index = i32::try_from(from).unwrap_or(i32::MAX);
        let mut q = TcMessage::default();
        q.header.index = index;
        q.header.handle = INGRESS_HANDLE;
        q.header.parent = TcHandle::INGRESS;
        q.attributes.push(TcAttribute::Kind("ingress".into()));
        self.request(
            what,
            "RTM_NEWQDISC (ingress)",
            RouteNetlinkMessage::NewQueueDiscipline(q),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;

        let mut key = TcU32Key::default();
        key.mask = 0;
        key.val = 0;
        let mut sel = TcU32Selector::default();
        sel.flags = TcU32SelectorFlags::Terminal;
        sel.nkeys = 1;
        sel.keys = vec![key];
        let mut mirror = TcMirror::default();
        mirror.generic.action = TcActionType::Stolen;
        mirror.eaction = TcMirrorActionType::EgressRedir;
        mirror.ifindex = to;
        let mut action = TcAction::default();
        action.attributes = vec![
            TcActionAttribute::Kind("mirred".into()),
            TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
                mirror,
            ))]),
        ];
        let mut f = TcMessage::default();
        f.header.index = index;
        f.header.parent = INGRESS_HANDLE;
        // tcm_info: the priority above the protocol, which is in network
        // byte order.
        f.header.info = (FILTER_PRIO << 16) | u32::from(ETH_P_ALL.to_be());
        f.attributes.push(TcAttribute::Kind("u32".into()));
        f.attributes.push(TcAttribute::Options(vec![
            TcOption::U32(TcFilterU32Option::Selector(sel)),
            TcOption::U32(TcFilterU32Option::Action(vec![action])),
        ]));
        self.request(
            what,
            "RTM_NEWTFILTER (u32, mirred egress redirect)",
            RouteNetlinkMessage::NewTrafficFilter(f),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(|_| ())
    }
}
