//! The SQLite store against the plain model of it (`core::tests::durable::Replay`): what a
//! reopen loads is what the committed ops leave, whatever batches they were committed in and
//! wherever the process died; and what it does with files it cannot use.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::broker::codec::{Inbound, Outbound, Version};
use crate::broker::core::tests::durable::Replay;
use crate::broker::core::tests::{Harness, connect_packet, publish, sub, user, with_will};

/// A stored state as comparable values: message bodies by content, not by allocation, and
/// expiry as seconds left (the store keeps wall-clock milliseconds).
fn view(s: &StoredState) -> Vec<String> {
    let now = Instant::now();
    let msg = |m: &Message| {
        format!(
            "{} {:?} q{} r{} exp{:?} o{:?} {:?}",
            m.topic,
            m.payload,
            m.qos as u8,
            m.retain,
            m.remaining_expiry(now).map(|s| s / 2),
            m.origin,
            m.props
        )
    };
    let mut out = Vec::new();
    for r in &s.sessions {
        out.push(format!(
            "session {} {} {} {} {:?} {:?}",
            r.sid, r.client_id, r.owner, r.expiry, r.disconnected_ms, r.subscriptions
        ));
    }
    for d in &s.deliveries {
        out.push(format!(
            "delivery {} {} {} q{} r{} {:?} {:?} {} {}",
            d.sid,
            d.ord,
            msg(&d.msg),
            d.qos as u8,
            d.retain,
            d.sub_ids,
            d.pkid,
            d.released,
            d.backlog
        ));
    }
    let received: BTreeSet<_> = s.received.iter().collect();
    out.push(format!("received {received:?}"));
    let mut wills: Vec<_> =
        s.wills.iter().map(|(sid, w)| format!("will {sid} {} {:?} {}", msg(&w.msg), w.expiry, w.due_ms)).collect();
    wills.sort();
    out.extend(wills);
    let mut retained: Vec<_> = s.retained.iter().map(|m| format!("retained {}", msg(m))).collect();
    retained.sort();
    out.extend(retained);
    out.push(format!("marks {:?}", s.marks));
    out
}

#[derive(Debug, Clone)]
enum Step {
    Publish {
        qos: u8,
        retain: bool,
        topic: u8,
        empty: bool,
    },
    Take {
        client: usize,
        ack: bool,
    },
    Drop {
        client: usize,
    },
    Reconnect {
        client: usize,
    },
    DyingClient {
        delay: u32,
    },
    Qos2In {
        release: bool,
    },
    /// The client (a subscriber, or 2: the QoS 2 publisher) starts over with Clean Start: its
    /// stored session ends, a new one begins.
    Clean {
        client: usize,
    },
    /// Time passes: delayed wills fall due, sessions of the dying clients expire.
    Wait {
        secs: u64,
    },
    /// A downlink message (retained or not) with the downlink's mark; or the mark alone.
    Downlink {
        retain: bool,
        alone: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..=2, any::<bool>(), 0u8..3, proptest::bool::weighted(0.1))
            .prop_map(|(qos, retain, topic, empty)| Step::Publish { qos, retain, topic, empty }),
        4 => (0..2usize, any::<bool>()).prop_map(|(client, ack)| Step::Take { client, ack }),
        1 => (0..2usize).prop_map(|client| Step::Drop { client }),
        2 => (0..2usize).prop_map(|client| Step::Reconnect { client }),
        1 => (0u32..3).prop_map(|delay| Step::DyingClient { delay: delay * 30 }),
        1 => any::<bool>().prop_map(|release| Step::Qos2In { release }),
        1 => (0..3usize).prop_map(|client| Step::Clean { client }),
        1 => (0u64..700).prop_map(|secs| Step::Wait { secs }),
        1 => (any::<bool>(), proptest::bool::weighted(0.2)).prop_map(|(retain, alone)| Step::Downlink { retain, alone }),
    ]
}

fn durable_connect(h: &mut Harness, id: &str) -> (crate::broker::core::ConnId, Vec<Outbound>) {
    let mut c = connect_packet(id, Version::V5);
    c.clean_start = false;
    c.session_expiry = 3600;
    h.connect_as(c, user("u"))
}

/// Drives a node through `steps`: two durable subscribers (one at QoS 2) that read, acknowledge
/// or not, come and go; a publisher of QoS 0, 1 and 2, retained or not (empty: cleared); clients
/// that leave delayed wills; a durable QoS 2 publisher whose ids are released or not. Returns
/// the store ops it made.
fn drive(h: &mut Harness, steps: &[Step]) {
    let mut subs: Vec<Option<crate::broker::core::ConnId>> = vec![None, None];
    for (client, conn) in subs.iter_mut().enumerate() {
        let (c, _) = durable_connect(h, &format!("s{client}"));
        h.send(c, sub(1, "t/#", if client == 0 { QoS::AtLeastOnce } else { QoS::ExactlyOnce }));
        h.recv(c);
        *conn = Some(c);
    }
    let p = h.connect("p", Version::V5);
    let (mut q2, _) = durable_connect(h, "q2");
    let mut next_pkid = 1u16;
    for (n, s) in steps.iter().enumerate() {
        match *s {
            Step::Publish { qos, retain, topic, empty } => {
                let payload = if empty { String::new() } else { format!("m{n}") };
                let pkid = if qos == 0 { 0 } else { next_pkid };
                next_pkid = next_pkid % 60_000 + 1;
                let Inbound::Publish(mut packet) =
                    publish(&format!("t/{topic}"), QoS::from_bits(qos).unwrap(), pkid, &payload)
                else {
                    unreachable!()
                };
                packet.retain = retain;
                if n % 3 == 0 {
                    packet.message_expiry = Some(3600);
                    packet.props.user = vec![("k".into(), format!("v{n}"))];
                }
                h.send(p, Inbound::Publish(packet));
                for o in h.recv(p) {
                    if let Outbound::PubRec { pkid, .. } = o {
                        h.send(p, Inbound::PubRel { pkid });
                    }
                }
                h.recv(p);
            }
            Step::Downlink { retain, alone } => {
                let now = h.now;
                if alone {
                    h.b.store_mark("downlink", format!("{n}"));
                } else {
                    let msg = Message {
                        topic: format!("t/d{}", n % 2).into(),
                        payload: Bytes::from(format!("d{n}")),
                        qos: QoS::ExactlyOnce,
                        retain,
                        props: Default::default(),
                        expires_at: None,
                        origin: None,
                        schema: None,
                    };
                    h.b.publish_downlink(None, msg, "downlink", format!("{n}"), now).expect("allowed");
                }
                h.recv(p);
            }
            Step::Take { client, ack } => {
                let Some(c) = subs[client] else { continue };
                for o in h.recv(c) {
                    match o {
                        Outbound::Publish { qos: QoS::AtLeastOnce, pkid, .. } if ack => {
                            h.send(c, Inbound::PubAck { pkid, reason: 0 })
                        }
                        Outbound::Publish { qos: QoS::ExactlyOnce, pkid, .. } => {
                            h.send(c, Inbound::PubRec { pkid, reason: 0 })
                        }
                        Outbound::PubRel { pkid, .. } if ack => h.send(c, Inbound::PubComp { pkid }),
                        _ => {}
                    }
                }
            }
            Step::Drop { client } => {
                if let Some(c) = subs[client].take() {
                    h.drop_conn(c);
                }
            }
            Step::Reconnect { client } => {
                if subs[client].is_none() {
                    subs[client] = Some(durable_connect(h, &format!("s{client}")).0);
                }
            }
            Step::DyingClient { delay } => {
                let mut c = with_will(&format!("d{n}"), "t/wills", delay);
                c.session_expiry = 600;
                c.clean_start = false;
                let (conn, _) = h.connect_as(c, user("u"));
                h.drop_conn(conn);
            }
            Step::Clean { client: 2 } => {
                h.drop_conn(q2);
                let mut c = connect_packet("q2", Version::V5);
                c.session_expiry = 3600;
                q2 = h.connect_as(c, user("u")).0;
            }
            Step::Clean { client } => {
                if let Some(c) = subs[client].take() {
                    h.drop_conn(c);
                }
                let mut c = connect_packet(&format!("s{client}"), Version::V5);
                c.session_expiry = 3600;
                let (conn, _) = h.connect_as(c, user("u"));
                h.send(conn, sub(1, "t/#", if client == 0 { QoS::AtLeastOnce } else { QoS::ExactlyOnce }));
                h.recv(conn);
                subs[client] = Some(conn);
            }
            Step::Wait { secs } => h.advance(Duration::from_secs(secs)),
            Step::Qos2In { release } => {
                let pkid = next_pkid;
                next_pkid = next_pkid % 60_000 + 1;
                h.send(q2, publish("t/q2", QoS::ExactlyOnce, pkid, "q2"));
                h.recv(q2);
                if release {
                    h.send(q2, Inbound::PubRel { pkid });
                    h.recv(q2);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    /// Ops committed in random batches (of whole groups: what one call on the core made), the
    /// process dying after a random one (what came after is never committed), then a reopen:
    /// it loads exactly what the model makes of the ops committed; and a node restored from
    /// that, driven on, and killed again, the same.
    #[test]
    fn a_reopened_store_holds_what_its_committed_ops_leave(
        phases in proptest::collection::vec((proptest::collection::vec(step(), 1..40), proptest::collection::vec(1usize..12, 1..12), any::<prop::sample::Index>()), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        let mut model = Replay::default();
        // The writer and the state it loaded go together: the restored node's messages are the
        // very ones the writer counts references to, as in a real start.
        let (mut w, mut loaded) = Writer::open(&path).unwrap();
        let mut h = Harness::new();
        for (steps, cuts, crash) in phases {
            // What the restore itself does (a will past due fires, an expired session ends)
            // is the run's first ops, committed or lost with the rest: left out, the ops after
            // it would release references it took (a will's body queued to a subscriber).
            let before = h.stored.len();
            h.restart_from(loaded, Duration::from_secs(1));
            drive(&mut h, &steps);
            let groups = &h.stored[before..];
            // Batches of the cut sizes (in groups the glue sends whole) in turn; the process
            // dies after batch `crash`.
            let mut batches: Vec<Vec<(u64, StoreOp)>> = Vec::new();
            let mut at = 0;
            for size in cuts.iter().cycle() {
                if at >= groups.len() {
                    break;
                }
                let end = (at + size).min(groups.len());
                batches.push(groups[at..end].iter().flatten().cloned().collect());
                at = end;
            }
            let survive = crash.index(batches.len() + 1);
            for batch in &batches[..survive] {
                w.commit(batch).unwrap();
                for (_, op) in batch {
                    model.apply(op);
                }
            }
            drop(w);
            let state;
            (w, state) = Writer::open(&path).unwrap();
            prop_assert_eq!(view(&state), view(&model.state()));
            // What is not committed was never acknowledged: the next run forgets it.
            loaded = state;
            h.stored.truncate(before);
        }
    }
}

/// A file of version 1 (sessions keyed by client id, nothing else) is migrated in place: its
/// sessions load with ids, and the file takes the new tables.
#[test]
fn a_version_1_store_is_migrated_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE sessions (client_id TEXT PRIMARY KEY, owner TEXT NOT NULL, expiry INTEGER NOT NULL, \
             disconnected_ms INTEGER, subscriptions TEXT NOT NULL);
             INSERT INTO sessions VALUES ('a', 'user:a', 600, 42, '[{\"filter\":\"a/#\",\"qos\":1,\"nl\":false,\"rap\":false,\"rh\":0,\"id\":null}]');
             INSERT INTO sessions VALUES ('b', 'user:b', 60, NULL, '[]');",
        )
        .unwrap();
    }
    let (_, state) = Writer::open(&path).unwrap();
    let got: Vec<(Sid, &str, u32, usize)> =
        state.sessions.iter().map(|r| (r.sid, r.client_id.as_str(), r.expiry, r.subscriptions.len())).collect();
    assert_eq!(got, [(1, "a", 600, 1), (2, "b", 60, 0)]);
    let (_, again) = Writer::open(&path).unwrap();
    assert_eq!(again.sessions.len(), 2, "opened twice, migrated once");
}

/// A file that is not a database is moved aside (its sessions are lost, and said to be); one
/// that another process holds locked is not: the open fails naming the lock, and the file is
/// where it was.
#[test]
fn a_damaged_store_is_moved_aside_and_a_locked_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let metrics = BrokerMetrics::new(&mut Default::default());
    let (store, state) = SessionStore::open(&path, metrics.clone()).unwrap();
    assert!(state.sessions.is_empty());
    drop(store);
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().any(|n| n.starts_with("sessions.db.corrupt-")), "{names:?}");

    let locked = dir.path().join("locked.db");
    drop(Writer::open(&locked).unwrap());
    let holder = Connection::open(&locked).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let e = Writer::open_waiting(&locked, Duration::from_millis(200), (Instant::now(), 0))
        .err()
        .expect("a held lock refuses the open");
    assert!(!is_damaged(&e), "{e}");
    assert!(e.to_string().contains("locked"), "{e}");
    holder.execute_batch("ROLLBACK").unwrap();
    assert!(Writer::open(&locked).is_ok());
}

/// A store the last run did not close says so at the next open, so queued messages go out
/// with DUP (they may have gone out before the crash); one closed cleanly does not.
#[test]
fn an_open_after_a_crash_is_told_from_one_after_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    let metrics = BrokerMetrics::new(&mut Default::default());
    let (store, state) = SessionStore::open(&path, metrics.clone()).unwrap();
    assert!(!state.unclean, "a new store");
    store.close();
    drop(store);
    let (store, state) = SessionStore::open(&path, metrics.clone()).unwrap();
    assert!(!state.unclean, "closed cleanly");
    // Killed: never closed.
    drop(store);
    let (store, state) = SessionStore::open(&path, metrics.clone()).unwrap();
    assert!(state.unclean, "the last run never closed it");
    store.close();
    drop(store);
    let (_, state) = SessionStore::open(&path, metrics).unwrap();
    assert!(!state.unclean);
}

/// A session record carries every subscription of its session: a SUBSCRIBE/UNSUBSCRIBE loop
/// queued one per packet, gigabytes within the op bound while the disk lagged. Readers wait
/// once [`MAX_PENDING_BYTES`] of records wait for the store, and go on when they are written.
#[tokio::test]
async fn session_records_waiting_for_the_store_hold_readers_back_by_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    let (store, _) = SessionStore::open(&path, BrokerMetrics::new(&mut Default::default())).unwrap();
    // The disk stalls: another connection holds the database.
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let opts =
        SubOptions { qos: QoS::AtLeastOnce, no_local: false, retain_as_published: false, retain_handling: 0, id: None };
    let record = |n: u64| SessionRecord {
        sid: 1,
        client_id: "looper".into(),
        owner: "anonymous".into(),
        expiry: 3600,
        subscriptions: (0..100).map(|i| (format!("{i}/{}", "x".repeat(1000)), opts)).collect(),
        disconnected_ms: Some(n),
    };
    // About 100 KiB each: 200 of them pass 16 MiB, far below the op bound.
    for n in 0..200 {
        store.send(vec![(n + 1, StoreOp::Session(record(n)))]);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), store.room()).await.is_err(),
        "readers go on while 20 MB of records wait"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(15), store.room()).await.is_ok(), "written, the readers go on");
}

/// An op keeps its message alive until it commits: retained QoS 0 messages, each replacing the
/// last on its topic, are held by nothing but their ops, and a flood of them while the disk
/// lagged took a node from 21 MB to 1 GB. Readers wait once the messages the ops hold reach
/// [`MAX_PENDING_BYTES`]; a message many ops of one call refer to (a publish queued for many
/// durable sessions) counts once.
#[tokio::test]
async fn messages_waiting_for_the_store_hold_readers_back_by_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    let (store, _) = SessionStore::open(&path, BrokerMetrics::new(&mut Default::default())).unwrap();
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let retained = |n: u64| {
        let msg = Message {
            topic: "flood".into(),
            payload: Bytes::from(vec![b'x'; 1 << 20]),
            qos: QoS::AtMostOnce,
            retain: true,
            props: PublishProps::default(),
            expires_at: None,
            origin: None,
            schema: None,
        };
        (n, StoreOp::Retain { topic: "flood".into(), msg: Some(Arc::new(msg)) })
    };
    for n in 1..=12 {
        store.send(vec![retained(n)]);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(100), store.room()).await.is_ok(),
        "12 MiB of messages leave room"
    );
    for n in 13..=20 {
        store.send(vec![retained(n)]);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), store.room()).await.is_err(),
        "readers go on while 20 MiB of messages wait"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(15), store.room()).await.is_ok(), "written, the readers go on");
    // One message queued for many sessions in one call is one message.
    let (_, msg) = retained(0);
    let StoreOp::Retain { msg: Some(msg), .. } = msg else { unreachable!() };
    let queued: Vec<(u64, StoreOp)> = (1..=30)
        .map(|sid| {
            let d = StoredDelivery {
                sid,
                ord: 1,
                msg: msg.clone(),
                qos: QoS::AtLeastOnce,
                retain: false,
                sub_ids: vec![],
                pkid: None,
                released: false,
                backlog: false,
            };
            (sid, StoreOp::Queue(d))
        })
        .collect();
    assert_eq!(backlog_bytes(&queued), msg.weight());
}

/// Ops with the downlink's mark commit once nothing more is queued, not after the interval: the
/// edge's subscribers and the cloud's ack wait on them, and nothing in them is undone soon. The
/// others wait the interval out, so that a delivery acknowledged within it is never written.
#[test]
fn only_ops_with_a_mark_skip_the_commit_interval() {
    let mark = (2, StoreOp::Mark { key: "downlink", value: "{}".into() });
    let settled = (1, StoreOp::Settled { sid: 1, pkid: 7 });
    assert!(urgent(&[settled.clone(), mark]));
    assert!(!urgent(&[settled]));
    assert!(!urgent(&[]));
}
