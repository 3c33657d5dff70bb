//! The core against a plain model: random subscribes, unsubscribes, publishes (retained or not,
//! QoS 0 or 1), disconnects and reconnects of three clients with persistent sessions, and
//! restarts of the node from what its session store holds. The model is a list of
//! subscriptions matched with `shared::topic::matches`; after every step each connected client
//! must have received exactly what the model says, across restarts too.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const FILTERS: &[&str] = &["a/b", "a/+", "a/#", "#", "+/b", "b", "$x/#", "$share/g/a/#", "$share/g/#", "$share/h/+/b"];
const TOPICS: &[&str] = &["a/b", "a/c", "b", "a", "$x/b", "c/b"];
const CLIENTS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Subscribe { client: usize, filter: usize, qos: u8, no_local: bool },
    Unsubscribe { client: usize, filter: usize },
    Publish { client: usize, topic: usize, qos: u8, retain: bool },
    Disconnect { client: usize },
    Reconnect { client: usize },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    prop_oneof![
        4 => (c.clone(), 0..FILTERS.len(), 0u8..=1, any::<bool>()).prop_map(|(client, filter, qos, no_local)| {
            // No Local on a shared subscription is a protocol error, not a model case.
            let no_local = no_local && !FILTERS[filter].starts_with("$share/");
            Op::Subscribe { client, filter, qos, no_local }
        }),
        1 => (c.clone(), 0..FILTERS.len()).prop_map(|(client, filter)| Op::Unsubscribe { client, filter }),
        8 => (c.clone(), 0..TOPICS.len(), 0u8..=1, any::<bool>()).prop_map(|(client, topic, qos, retain)| Op::Publish { client, topic, qos, retain }),
        1 => c.clone().prop_map(|client| Op::Disconnect { client }),
        1 => c.prop_map(|client| Op::Reconnect { client }),
        1 => Just(Op::Restart),
    ]
}

#[derive(Default)]
struct Model {
    /// Per client: filter -> (QoS, No Local).
    subs: Vec<BTreeMap<&'static str, (u8, bool)>>,
    online: Vec<bool>,
    /// Topic -> (payload, QoS).
    retained: BTreeMap<&'static str, (String, u8)>,
    /// QoS 1 payloads an offline client must get when it comes back.
    owed: Vec<BTreeSet<String>>,
    /// Payloads of QoS 1 messages whose shared group had no member online: one offline member
    /// gets them, the model does not say which.
    shared_owed: BTreeSet<String>,
}

fn split(filter: &str) -> (Option<&str>, &str) {
    match filter.strip_prefix("$share/").and_then(|r| r.split_once('/')) {
        Some((group, f)) => (Some(group), f),
        None => (None, filter),
    }
}

impl Model {
    /// What `publish` gives each client: plain deliveries (payload, QoS) and the shared groups
    /// that match, with their members.
    fn route(&self, from: usize, topic: &str, qos: u8) -> (Vec<Option<u8>>, BTreeMap<&'static str, Vec<usize>>) {
        let mut plain = vec![None; CLIENTS];
        let mut groups: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
        for (client, subs) in self.subs.iter().enumerate() {
            for (filter, (granted, no_local)) in subs {
                let (group, f) = split(filter);
                if !shared::topic::matches(f, topic) {
                    continue;
                }
                match group {
                    Some(_) => groups.entry(*filter).or_default().push(client),
                    None if *no_local && client == from => {}
                    None => plain[client] = Some(plain[client].unwrap_or(0).max(*granted).min(qos)),
                }
            }
        }
        // Groups of the same name and filter are one group.
        (plain, groups)
    }
}

/// Everything a client was sent since last asked, its QoS 1 messages acknowledged.
fn take(h: &mut Harness, conn: ConnId) -> Vec<(String, QoS, bool)> {
    let mut got = Vec::new();
    loop {
        let out = h.recv(conn);
        let mut acked = false;
        for p in out {
            if let Outbound::Publish { msg, qos, pkid, retain, .. } = p {
                got.push((String::from_utf8_lossy(&msg.payload).into_owned(), qos, retain));
                if qos != QoS::AtMostOnce {
                    h.send(conn, Inbound::PubAck { pkid, reason: 0 });
                    acked = true;
                }
            }
        }
        if !acked {
            return got;
        }
    }
}

fn connect_client(h: &mut Harness, client: usize) -> (ConnId, Vec<Outbound>) {
    let mut c = connect_packet(&format!("c{client}"), Version::V5);
    c.clean_start = false;
    c.session_expiry = 3600;
    h.connect_as(c, user("u"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn the_router_delivers_what_the_model_says(ops in proptest::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        let mut m = Model { subs: vec![BTreeMap::new(); CLIENTS], online: vec![true; CLIENTS], owed: vec![BTreeSet::new(); CLIENTS], ..Model::default() };
        let mut conns: Vec<ConnId> = (0..CLIENTS).map(|c| connect_client(&mut h, c).0).collect();
        for (n, op) in ops.into_iter().enumerate() {
            prop_assert_eq!(h.b.check_accounting(), Ok(()), "before step {}", n);
            match op {
                Op::Subscribe { client, filter, qos, no_local } => {
                    if !m.online[client] { continue }
                    let f = FILTERS[filter];
                    h.send(conns[client], sub_with(1, f, QoS::from_bits(qos).unwrap(), |r| r.no_local = no_local));
                    m.subs[client].insert(f, (qos, no_local));
                    let got = take(&mut h, conns[client]);
                    // Retained messages the filter matches (none for a shared subscription).
                    let mut want: Vec<String> = match split(f) {
                        (None, plain) => m.retained.iter().filter(|(t, _)| shared::topic::matches(plain, t)).map(|(_, (p, _))| p.clone()).collect(),
                        (Some(_), _) => Vec::new(),
                    };
                    let mut got_payloads: Vec<String> = got.iter().map(|g| g.0.clone()).collect();
                    want.sort();
                    got_payloads.sort();
                    prop_assert_eq!(got_payloads, want, "step {}: retained for {}", n, f);
                    prop_assert!(got.iter().all(|g| g.2), "retained messages go with RETAIN set");
                }
                Op::Unsubscribe { client, filter } => {
                    if !m.online[client] { continue }
                    h.send(conns[client], Inbound::Unsubscribe { pkid: 2, filters: vec![FILTERS[filter].into()] });
                    m.subs[client].remove(FILTERS[filter]);
                    h.recv(conns[client]);
                }
                Op::Publish { client, topic, qos, retain } => {
                    if !m.online[client] { continue }
                    let t = TOPICS[topic];
                    let payload = format!("m{n}");
                    let Inbound::Publish(mut p) = publish(t, QoS::from_bits(qos).unwrap(), 1, &payload) else { unreachable!() };
                    p.retain = retain;
                    h.send(conns[client], Inbound::Publish(p));
                    if retain {
                        m.retained.insert(t, (payload.clone(), qos));
                    }
                    let (plain, groups) = m.route(client, t, qos);
                    let mut copies = [0usize; CLIENTS];
                    for c in 0..CLIENTS {
                        if !m.online[c] {
                            continue;
                        }
                        let got = take(&mut h, conns[c]);
                        prop_assert!(got.iter().all(|g| g.0 == payload), "step {}: client {} got {:?}", n, c, got);
                        copies[c] = got.len();
                        let in_groups = groups.values().filter(|members| members.contains(&c)).count();
                        let want_plain = usize::from(plain[c].is_some());
                        prop_assert!(copies[c] >= want_plain && copies[c] <= want_plain + in_groups, "step {}: client {} got {} copies of {} on {}, plain {:?}, groups {:?}", n, c, copies[c], payload, t, plain[c], groups);
                        if in_groups == 0 && let Some(q) = plain[c] {
                            prop_assert_eq!(got[0].1 as u8, q, "step {}: delivered QoS", n);
                        }
                    }
                    for (c, p) in plain.iter().enumerate() {
                        if !m.online[c] && p.is_some_and(|q| q > 0) {
                            m.owed[c].insert(payload.clone());
                        }
                    }
                    // Each group with a member online had one member online get it.
                    let online_groups = groups.values().filter(|members| members.iter().any(|c| m.online[*c])).count();
                    let plain_online = plain.iter().enumerate().filter(|(c, p)| p.is_some() && m.online[*c]).count();
                    prop_assert_eq!(copies.iter().sum::<usize>(), plain_online + online_groups, "step {}: {} on {}", n, payload, t);
                    if qos > 0 && groups.values().any(|members| members.iter().all(|c| !m.online[*c])) {
                        m.shared_owed.insert(payload.clone());
                    }
                }
                Op::Disconnect { client } => {
                    if !m.online[client] { continue }
                    h.drop_conn(conns[client]);
                    m.online[client] = false;
                }
                Op::Restart => {
                    // Every client is cut off; what their sessions hold comes back.
                    h.restart(Duration::from_secs(1));
                    m.online = vec![false; CLIENTS];
                }
                Op::Reconnect { client } => {
                    if m.online[client] { continue }
                    let (conn, first) = connect_client(&mut h, client);
                    conns[client] = conn;
                    m.online[client] = true;
                    let mut got: BTreeSet<String> = payloads(&first).into_iter().collect();
                    // Unacknowledged, these would rightly come again on the next reconnect.
                    for p in &first {
                        if let Outbound::Publish { qos, pkid, .. } = p && *qos != QoS::AtMostOnce {
                            h.send(conn, Inbound::PubAck { pkid: *pkid, reason: 0 });
                        }
                    }
                    got.extend(take(&mut h, conn).into_iter().map(|g| g.0));
                    let owed = std::mem::take(&mut m.owed[client]);
                    prop_assert!(got.is_superset(&owed), "step {}: client {} owed {:?}, got {:?}", n, client, owed, got);
                    let extra: BTreeSet<String> = got.difference(&owed).cloned().collect();
                    prop_assert!(extra.is_subset(&m.shared_owed), "step {}: unexpected {:?}", n, extra);
                }
            }
        }
    }
}
