//! systemd's readiness notifications (`sd_notify`): `READY=1` once a process serves, `STATUS=`
//! lines, `STOPPING=1` as it shuts down; one datagram each to the socket in `$NOTIFY_SOCKET`
//! (a path, or an abstract name after `@`). Without the variable (not started by systemd with
//! `Type=notify`) nothing is sent. The units are `Type=notify`, so a unit ordered after ours
//! starts once its listeners are bound, not when the process was forked.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (`KEY=value` lines) to the service manager; whether there was one.
pub(crate) fn notify(state: &str) -> std::io::Result<bool> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(false) };
    notify_to(socket.as_bytes(), state)?;
    Ok(true)
}

fn notify_to(socket: &[u8], state: &str) -> std::io::Result<()> {
    let out = UnixDatagram::unbound()?;
    match socket.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            out.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            out.send_to(state.as_bytes(), std::ffi::OsStr::from_bytes(socket))?;
        }
    }
    Ok(())
}

/// [`notify`], a failure logged rather than returned: a service manager that cannot be told
/// is no reason to stop serving.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        eprintln!("cannot notify the service manager ({state:?}): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_reach_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str().as_bytes(), "READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("ehb-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let manager = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(format!("@{name}").as_bytes(), "STOPPING=1").unwrap();
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
