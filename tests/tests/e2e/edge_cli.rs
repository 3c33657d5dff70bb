//! The `edge-node` binary: example configs, `check-config` errors, `passwd`, start-up failures,
//! SIGHUP reload and SIGTERM shutdown, as a user runs them.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use e2e_tests::client::{self, Client};
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::workspace_bin;
use edge_node::config::EdgeConfig;
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(5);

fn edge_node(args: &[&str]) -> Output {
    Command::new(workspace_bin("edge-node")).args(args).output().expect("run edge-node")
}

fn config_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config"))
}

#[test]
fn every_example_config_loads() {
    let mut edge_configs = 0;
    for entry in std::fs::read_dir(config_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "acl.toml" => {
                edge_node::auth::Acl::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            n if (n.starts_with("edge") || n.starts_with("tco-")) && n.ends_with(".toml") => {
                EdgeConfig::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
                let out = edge_node(&["check-config", "--config", path.to_str().unwrap()]);
                assert!(out.status.success(), "check-config {name}: {}", String::from_utf8_lossy(&out.stderr));
                edge_configs += 1;
            }
            _ => {}
        }
    }
    assert!(edge_configs >= 1, "no edge config found in config/");
}

#[test]
fn default_config_prints_and_loads() {
    let out = edge_node(&["print-default-config"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let config = EdgeConfig::from_toml(&text, Path::new(".")).expect("printed defaults load");
    assert_eq!(config.listeners[0].bind.to_string(), "127.0.0.1:1883");
}

/// Each kind of bad config fails `check-config` with exit code 2 and a line naming the key.
#[test]
fn bad_configs_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[broker]\nmax_conections = 10\n", "unknown field `max_conections`"),
        ("[broker]\nconnect_timeout = \"ten\"\n", "invalid duration"),
        ("[broker]\nmax_packet_size = \"huge\"\n", "invalid byte size"),
        ("[[listener]]\nname = \"x\"\nbind = \"1.2.3.4\"\n", "invalid socket address"),
        ("[[listener]]\nname = \"lan\"\nbind = \"0.0.0.0:1883\"\nanonymous = true\n", "listener[0].anonymous"),
        (
            "[[listener]]\nname = \"t\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n[listener.tls]\ncert = \"missing.pem\"\nkey = \"missing.key\"\n",
            "listener[0].tls.cert",
        ),
        ("[auth]\npassword_file = \"nope\"\n", "auth.password_file"),
        ("[log]\nlevel = \"[[[\"\n", "log.level"),
        ("node_id = \"a/b\"\n", "node_id"),
        (
            "[[class]]\nname = \"c\"\nfilters = [\"c/#\"]\nroute = \"central\"\ngovernance = \"central-only\"\n\
             [tco.prices]\nmonths = 0\nuplink_per_gb = -1\nfte_month = 1\n[tco.prices.edge_direct]\nhardware = 1\nfte = 0\n\
             [tco.prices.central]\nhardware = 1\nfte = 0\n[tco.class.c]\npin = \"edge-direct\"\n",
            "tco.class.c.pin: governance central-only does not allow edge-direct",
        ),
        (
            "[tco]\nthreshold = 1.5\n[tco.prices]\nmonths = 36\nuplink_per_gb = 1\nfte_month = 1\n\
             [tco.prices.edge_direct]\nhardware = 1\nfte = 0\n[tco.prices.central]\nhardware = 1\nfte = 0\n\
             [tco.class.sync]\nsla_ms = 10\n",
            "tco.class.sync.msg_per_s: a class not in [[class]] needs msg_per_s and bytes_per_msg",
        ),
        ("[models]\npublic_key = \"missing.pub\"\nfollow = [\"a/b\"]\n", "models.public_key"),
        ("[models]\npublic_key = \"/dev/null\"\nfollow = [\"a/b\"]\n", "models.follow[0]"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = edge_node(&["check-config", "--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i} should fail: {stderr}");
        assert!(stderr.contains(expected), "case {i}: expected {expected:?} in:\n{stderr}");
    }
    // A file that is not there.
    let out = edge_node(&["check-config", "--config", "/nonexistent/edge.toml"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file /nonexistent/edge.toml"));
}

#[test]
fn unusable_tls_files_are_reported_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), "not a certificate").unwrap();
    std::fs::write(dir.path().join("key.pem"), "not a key").unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(&path, "[[listener]]\nname = \"t\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n[listener.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n").unwrap();
    let out = edge_node(&["check-config", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("listener[0].tls") && stderr.contains("cert.pem"), "{stderr}");
}

#[test]
fn port_in_use_fails_start_with_one_clear_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(
        &path,
        format!("[http]\n[[listener]]\nname = \"local\"\nbind = \"127.0.0.1:{port}\"\nanonymous = true\n"),
    )
    .unwrap();
    let out = Command::new(workspace_bin("edge-node"))
        .args(["run", "--config", path.to_str().unwrap()])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.trim().ends_with(&format!(
            "listener \"local\" cannot bind 127.0.0.1:{port}: Address already in use (os error 98)"
        )),
        "{stderr}"
    );
}

/// `[runtime] worker_threads` is the runtime's worker count, over `TOKIO_WORKER_THREADS`, which
/// tokio takes when the key is unset (the start's log line says how many it has).
#[test]
fn the_runtime_has_the_workers_the_config_names() {
    let workers = |extra: &str, env: &[(&str, &std::ffi::OsStr)]| {
        let dir = tempfile::tempdir().unwrap();
        let edge = EdgeProcess::start_with_env(dir.path(), &config_text(extra), env);
        let log = edge.stderr();
        let n = log.lines().find(|l| l.contains("async runtime")).and_then(|l| l.split("workers=").nth(1));
        n.and_then(|n| n.split_whitespace().next()).map(str::to_owned).unwrap_or_else(|| panic!("{log}"))
    };
    let env = |n: &'static str| [("TOKIO_WORKER_THREADS", std::ffi::OsStr::new(n))];
    assert_eq!(workers("[runtime]\nworker_threads = 1\n", &[]), "1");
    assert_eq!(workers("", &env("3")), "3");
    assert_eq!(workers("[runtime]\nworker_threads = 2\n", &env("5")), "2");
    // A value tokio would panic at is refused by name; the key, when set, is all that counts.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edge.toml");
    std::fs::write(&config, config_text("")).unwrap();
    for bad in ["0", "two"] {
        let out = Command::new(workspace_bin("edge-node"))
            .args(["run", "--config", config.to_str().unwrap()])
            .env("TOKIO_WORKER_THREADS", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("TOKIO_WORKER_THREADS=\"{bad}\" must be")), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(workers("[runtime]\nworker_threads = 1\n", &env("0")), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwd_then_login() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    for password in ["first", "second"] {
        let mut child = Command::new(workspace_bin("edge-node"))
            .args(["passwd", "--file", file.to_str().unwrap(), "ops", "--password-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(format!("{password}\n").as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("ops:$argon2id$") && !text.contains("second"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    let edge = EdgeProcess::start(
        dir.path(),
        &config_text("[auth]\npassword_file = \"passwd\"\n[[listener]]\nname = \"net\"\nbind = \"127.0.0.1:0\"\n"),
    );
    let mut opts = client::options(edge.addr("net"), "ops");
    opts.set_credentials("ops", "second");
    Client::connect(opts).await.expect("changed password accepted");
    let mut opts = client::options(edge.addr("net"), "ops-old");
    opts.set_credentials("ops", "first");
    assert!(Client::connect(opts).await.is_err(), "old password still accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_acl_without_dropping_clients() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, "[anonymous]\npublish = [\"#\"]\nsubscribe = [\"#\"]\n").unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text("[auth]\nacl_file = \"acl.toml\"\n"));
    let local = edge.addr("local");
    let mut watcher = Client::anonymous(local, "watcher").await;
    watcher.subscribe("plant/#", QoS::AtLeastOnce).await;
    let mut publisher = Client::anonymous(local, "publisher").await;
    publisher.publish("plant/a", QoS::AtLeastOnce, false, "before").await;
    assert_eq!(watcher.recv(WAIT).await.expect("allowed before reload").payload, "before");

    // Anonymous clients lose publish rights; a broken file must not replace the running ACL.
    std::fs::write(&acl, "[anonymous\n").unwrap();
    edge.signal("HUP");
    publisher.publish("plant/b", QoS::AtLeastOnce, false, "broken file ignored").await;
    assert_eq!(watcher.recv(WAIT).await.expect("old ACL kept").payload, "broken file ignored");
    assert!(e2e_tests::eventually(WAIT, || edge.stderr().contains("reload failed")).await, "{}", edge.stderr());

    std::fs::write(&acl, "[anonymous]\nsubscribe = [\"#\"]\n").unwrap();
    edge.signal("HUP");
    assert!(e2e_tests::eventually(WAIT, || edge.stderr().contains("reloaded credentials")).await);
    publisher.publish("plant/c", QoS::AtLeastOnce, false, "after").await;
    assert!(watcher.recv(Duration::from_millis(500)).await.is_none(), "publish allowed after the ACL removed it");
    assert!(publisher.closed(Duration::from_millis(200)).await.is_none(), "publisher dropped by reload");
    assert!(watcher.closed(Duration::from_millis(200)).await.is_none(), "watcher dropped by reload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_tls_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = e2e_tests::certs::Ca::new(dir.path(), "one");
    ca.server(dir.path(), "server");
    let extra = "[[listener]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n[listener.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n";
    // A TLS listener on loopback may be anonymous.
    let edge = EdgeProcess::start(dir.path(), &config_text(extra));
    let port = edge.addr("tls").port().to_string();
    let pub_with = |cafile: std::path::PathBuf| {
        let port = port.clone();
        async move {
            tokio::process::Command::new("mosquitto_pub")
                .args(["-h", "localhost", "-p", &port, "-q", "1", "-t", "t", "-m", "x", "--cafile"])
                .arg(cafile)
                .status()
                .await
                .unwrap()
                .success()
        }
    };
    assert!(pub_with(ca.cert_path.clone()).await);
    // Replace the server certificate with one from a new CA and reload.
    let two = e2e_tests::certs::Ca::new(dir.path(), "two");
    two.server(dir.path(), "server");
    edge.signal("HUP");
    assert!(e2e_tests::eventually(WAIT, || edge.stderr().contains("reloaded credentials")).await);
    assert!(pub_with(two.cert_path.clone()).await, "new certificate not served after SIGHUP");
    assert!(!pub_with(ca.cert_path.clone()).await, "old certificate still served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_with_clients_connected() {
    let dir = tempfile::tempdir().unwrap();
    let mut edge = EdgeProcess::start(dir.path(), &config_text(""));
    let mut c = Client::anonymous(edge.addr("local"), "stay").await;
    c.subscribe("x", QoS::AtLeastOnce).await;
    edge.signal("TERM");
    let status = edge.wait_exit(Duration::from_secs(10)).expect("edge-node still running 10 s after SIGTERM");
    assert!(status.success(), "exit {status}: {}", edge.stderr());
    assert!(c.closed(WAIT).await.is_some(), "client not disconnected");
    assert!(edge.stderr().contains("shutting down"));
}

/// `check-config` on both binaries loads every certificate and key as a start would, and more
/// (issue 30): a key that is not its certificate's, the bridge's server certificate where the
/// edge's client certificate belongs, and the reverse, exit 2 naming the key and the file; a
/// certificate expiring within 30 days is named as a warning and the check passes.
#[test]
fn check_config_catches_swapped_mismatched_and_expiring_certificates() {
    use e2e_tests::certs::Ca;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "fleet");
    let server = ca.server(d, "bridge");
    let edge = ca.client(d, "edge-1");
    let soon = ca.client_until(d, "edge-soon", Duration::from_secs(10 * 24 * 3600));
    let uplink = |cert: &Path, key: &Path| {
        let path = d.join("edge.toml");
        let text = format!(
            "[uplink]\nserver = \"127.0.0.1:4433\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            ca.cert_path.display(),
            cert.display(),
            key.display()
        );
        std::fs::write(&path, text).unwrap();
        edge_node(&["check-config", "--config", path.to_str().unwrap()])
    };
    let ok = uplink(&edge.cert, &edge.key);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let cases = [
        (&server.cert, &server.key, "is a server certificate; here it must be a client (clientAuth) certificate"),
        (&edge.cert, &server.key, "is not the certificate of the key"),
    ];
    for (cert, key, want) in cases {
        let out = uplink(cert, key);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("uplink: ") && stderr.contains(want), "{want}: {stderr}");
    }
    let out = uplink(&soon.cert, &soon.key);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: uplink: ") && stderr.contains("expires in 9 days"), "{stderr}");

    let bridge = |cert: &Path, key: &Path| {
        let path = d.join("cloud.toml");
        let text = format!(
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n[sink]\nkind = \"sqlite\"\npath = \"{}\"\n",
            cert.display(),
            key.display(),
            ca.cert_path.display(),
            d.join("central.db").display()
        );
        std::fs::write(&path, text).unwrap();
        Command::new(workspace_bin("cloud-bridge"))
            .args(["check-config", "--config", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let ok = bridge(&server.cert, &server.key);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let out = bridge(&edge.cert, &edge.key);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("server: ") && stderr.contains("is a client certificate"), "{stderr}");
}

/// What systemd sees, and edge.toml on SIGHUP (issue 30): the node says `READY=1` on
/// `$NOTIFY_SOCKET` once it listens and `STOPPING=1` when it stops (the units are
/// `Type=notify`); a SIGHUP reads edge.toml again: a new `acl_file` applies at once, and a
/// changed spool budget is named as waiting for a restart (before, the reload said "reloaded"
/// and ignored every change to edge.toml), and a new `log.level` applies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_manager_hears_ready_and_stopping_and_a_sighup_rereads_edge_toml() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notify");
    let manager = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
    manager.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::fs::write(dir.path().join("a.toml"), "[anonymous]\npublish = [\"#\"]\nsubscribe = [\"#\"]\n").unwrap();
    std::fs::write(dir.path().join("b.toml"), "[anonymous]\nsubscribe = [\"#\"]\n").unwrap();
    let edge = EdgeProcess::start_with_env(
        dir.path(),
        &config_text("[auth]\nacl_file = \"a.toml\"\n"),
        // No RUST_LOG: it would take precedence over log.level.
        &[("NOTIFY_SOCKET", socket.as_os_str()), ("RUST_LOG", "".as_ref())],
    );
    let mut buf = [0u8; 256];
    let n = manager.recv(&mut buf).expect("READY=1 on the notify socket");
    assert!(buf[..n].starts_with(b"READY=1"), "{:?}", String::from_utf8_lossy(&buf[..n]));

    let local = edge.addr("local");
    let mut watcher = Client::anonymous(local, "watcher").await;
    watcher.subscribe("plant/#", QoS::AtLeastOnce).await;
    let publisher = Client::anonymous(local, "publisher").await;
    publisher.publish("plant/a", QoS::AtLeastOnce, false, "before").await;
    assert_eq!(watcher.recv(WAIT).await.expect("allowed by a.toml").payload, "before");

    std::fs::write(
        dir.path().join("edge.toml"),
        config_text("[auth]\nacl_file = \"b.toml\"\n[spool]\nbudget = \"128MiB\"\n[log]\nlevel = \"debug\"\n"),
    )
    .unwrap();
    // At `info`, a client's connection is not logged.
    assert!(!edge.stderr().contains("connected"), "{}", edge.stderr());
    edge.signal("HUP");
    let named = e2e_tests::eventually(WAIT, || {
        let log = edge.stderr();
        log.contains("applied at the next restart") && log.contains("spool.budget")
    })
    .await;
    assert!(named, "{}", edge.stderr());
    assert!(!edge.stderr().contains("auth.acl_file"), "auth is applied, not named: {}", edge.stderr());
    assert!(edge.stderr().contains("log level changed"), "{}", edge.stderr());
    assert!(!edge.stderr().contains("log.level"), "the level is applied, not named: {}", edge.stderr());
    // At `debug` it is.
    let _late = Client::anonymous(local, "late").await;
    let debug = e2e_tests::eventually(WAIT, || edge.stderr().contains("\"late\"")).await;
    assert!(debug, "{}", edge.stderr());
    publisher.publish("plant/b", QoS::AtLeastOnce, false, "after").await;
    assert!(watcher.recv(Duration::from_millis(500)).await.is_none(), "b.toml takes publish away");

    edge.signal("TERM");
    let n = manager.recv(&mut buf).expect("STOPPING=1 on the notify socket");
    assert_eq!(&buf[..n], b"STOPPING=1");
}

/// `edge-node spool backup FILE` (issue 30): a consistent copy of a running node's spool, the
/// records still in the WAL included; the copy opens as a spool of the same epoch; an existing
/// FILE is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_spool_is_backed_up_whole() {
    let dir = tempfile::tempdir().unwrap();
    let classes = e2e_tests::fixtures::with_spool(&[e2e_tests::fixtures::telemetry()]);
    let edge = EdgeProcess::start(dir.path(), &config_text(&classes));
    let publisher = Client::anonymous(edge.addr("local"), "pub").await;
    for i in 0..100 {
        publisher.publish(&format!("telemetry/a/{i}"), QoS::AtLeastOnce, false, "x").await;
    }
    assert!(
        e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 100.0).await
    );
    let config = dir.path().join("edge.toml");
    let copy = dir.path().join("backup.db");
    let out = edge_node(&["spool", "backup", "--config", config.to_str().unwrap(), copy.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.starts_with("backed up 100 records of epoch "), "{said}");
    let stats = edge_node::spool::inspect::stats(&copy).unwrap();
    let live = edge_node::spool::inspect::stats(&edge.dir.join("spool.db")).unwrap();
    assert_eq!(stats.epoch, live.epoch);
    assert_eq!(stats.lanes.iter().map(|l| l.messages).sum::<u64>(), 100);
    let again = edge_node(&["spool", "backup", "--config", config.to_str().unwrap(), copy.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("the backup file exists"));
}
