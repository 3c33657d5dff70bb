//! The device images as a user gets them (`HIL_TARGET`'s, aarch64 by default): the OCI archive unpacks (every digest
//! checked) into a root whose binary starts under qemu with only the image's own libraries and
//! serves MQTT; the .deb carries the binary, the config as a conffile and the hardened unit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `scripts/package.sh` for the target in the given profile (`hil` unless `HIL_IMAGE_PROFILE`);
/// returns its JSON line.
fn package(target: hil::Target) -> serde_json::Value {
    let root = e2e_tests::workspace_root();
    let profile = std::env::var("HIL_IMAGE_PROFILE").unwrap_or_else(|_| "hil".into());
    let out = Command::new(root.join("scripts/package.sh"))
        .args([target.triple, "edge-node", &profile])
        .current_dir(&root)
        .output()
        .expect("run scripts/package.sh");
    assert!(out.status.success(), "package.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("package.sh output {line:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oci_image_runs_under_qemu_from_its_own_root_and_the_deb_is_complete() {
    let root = e2e_tests::workspace_root();
    let target = hil::target();
    let built = package(target);
    let oci = root.join(built["oci"].as_str().unwrap());
    let deb = root.join(built["deb"].as_str().unwrap());

    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("root");
    let out = Command::new("python3")
        .arg(root.join("scripts/oci_unpack.py"))
        .arg(&oci)
        .arg(&image)
        .output()
        .expect("oci_unpack.py");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["architecture"], target.oci);
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/edge-node");
    for file in ["usr/bin/edge-node", "etc/edge-node/edge.toml", "etc/ssl/certs/ca-certificates.crt"] {
        assert!(image.join(file).is_file(), "{file} missing from the image");
    }
    // docker load reads manifest.json; it names the same blobs.
    let listing = Command::new("tar").arg("tf").arg(&oci).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("manifest.json") && listing.contains("oci-layout"), "{listing}");

    // The binary from the image root alone: qemu's -L points at the image, and so does the
    // library path, so nothing of the build machine's libraries for the target is used.
    let qemu = |args: &[&str]| {
        let mut c = Command::new(target.qemu);
        c.arg("-L")
            .arg(&image)
            .arg("-E")
            .arg(format!("LD_LIBRARY_PATH={}", image.join("lib").join(target.gnu).display()));
        c.arg(image.join("usr/bin/edge-node")).args(args);
        c
    };
    // Runs on glibc 2.34 (Ubuntu 22.04 / JetPack 6, Debian 12): no newer symbol version.
    let needs = Command::new("readelf").arg("--version-info").arg(image.join("usr/bin/edge-node")).output().unwrap();
    let needs = String::from_utf8_lossy(&needs.stdout);
    let newest = needs
        .split("GLIBC_")
        .skip(1)
        .filter_map(|v| {
            let v: String = v.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            Some((parts.next()?, parts.next().unwrap_or(0)))
        })
        .max()
        .expect("glibc symbol versions");
    assert!(newest <= (2, 34), "the binary needs glibc {}.{}", newest.0, newest.1);

    let version = qemu(&["--version"]).output().unwrap();
    assert!(version.status.success(), "{}", String::from_utf8_lossy(&version.stderr));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("edge-node "));

    // And it serves: the image's config, with the state paths moved into the test dir.
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let port = e2e_tests::free_port();
    let text = std::fs::read_to_string(image.join("etc/edge-node/edge.toml"))
        .unwrap()
        .replace("/var/lib/edge-node", state.to_str().unwrap())
        .replace("127.0.0.1:1883", &format!("127.0.0.1:{port}"))
        .replace("127.0.0.1:9464", "127.0.0.1:0");
    let config_path = dir.path().join("edge.toml");
    std::fs::write(&config_path, text).unwrap();
    let mut child = qemu(&["run", "--config", config_path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut served = false;
    for _ in 0..300 {
        if let Ok(mut c) = e2e_tests::client::Client::connect(e2e_tests::client::options(addr, "image-check")).await {
            c.subscribe("inference/#", rumqttc::QoS::AtLeastOnce).await;
            c.publish("inference/cam/1", rumqttc::QoS::AtLeastOnce, false, "ok").await;
            served = c.recv(Duration::from_secs(10)).await.is_some_and(|p| &p.payload[..] == b"ok");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(served, "the image's edge-node did not serve MQTT:\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(state.join("spool.db").exists(), "no spool in the state directory");

    check_deb(&deb, target);
}

fn check_deb(deb: &Path, target: hil::Target) {
    let info = Command::new("dpkg-deb").arg("--field").arg(deb).output().unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    let arch = format!("Architecture: {}", target.debian);
    for field in ["Package: edge-node", &arch, "Depends: libc6 (>= 2.34), adduser"] {
        assert!(info.contains(field), "{field} not in:\n{info}");
    }
    let contents = Command::new("dpkg-deb").arg("--contents").arg(deb).output().unwrap();
    let contents = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/edge-node",
        "./etc/edge-node/edge.toml",
        "./lib/systemd/system/edge-node.service",
        "./etc/edge-node/certs/",
    ] {
        assert!(contents.contains(path), "{path} not in:\n{contents}");
    }
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("dpkg-deb").arg("--control").arg(deb).arg(dir.path()).status().unwrap();
    assert!(status.success());
    let conffiles = std::fs::read_to_string(dir.path().join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/edge-node/edge.toml");
    let unit = Command::new("dpkg-deb").arg("--fsys-tarfile").arg(deb).output().unwrap();
    let mut tar = Command::new("tar")
        .args(["-xO", "./lib/systemd/system/edge-node.service"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    tar.stdin.take().unwrap().write_all(&unit.stdout).unwrap();
    let unit = String::from_utf8(tar.wait_with_output().unwrap().stdout).unwrap();
    for line in [
        "User=edge-node",
        "ProtectSystem=strict",
        "StateDirectory=edge-node",
        "NoNewPrivileges=yes",
        "LimitNICE=10",
        "SystemCallFilter=setpriority sched_setscheduler sched_getscheduler",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} not in the unit:\n{unit}");
    }
}
