//! What changed between the running config and edge.toml as it is now, for SIGHUP: the keys a
//! reload applies live and the ones that wait for a restart.

use super::EdgeConfig;

/// The keys a reload applies without a restart: the password and ACL files (`auth`), each
/// listener's certificate files (`listener[i].tls`, the same listeners in the same order) and
/// the log level (`log.level`, applied by `main`, which owns the log subscriber).
const LIVE: [&str; 1] = ["auth"];
const LIVE_KEYS: [&str; 1] = ["log.level"];

impl EdgeConfig {
    /// The dotted keys (two levels: `uplink.servers`, `listener[1].bind`) whose values differ
    /// in `now` and are not applied live: what a reload names as waiting for a restart.
    pub(crate) fn restart_needed(&self, now: &EdgeConfig) -> Vec<String> {
        let (Ok(a), Ok(b)) = (toml::Value::try_from(self), toml::Value::try_from(now)) else {
            return vec!["(the config)".into()];
        };
        let mut out = Vec::new();
        diff("", &a, &b, 0, &mut out);
        out.retain(|key| {
            let top = key.split(['.', '[']).next().unwrap_or_default();
            let tls = key.starts_with("listener[") && key.contains("].tls");
            !LIVE.contains(&top) && !LIVE_KEYS.contains(&key.as_str()) && !tls
        });
        out
    }
}

fn diff(prefix: &str, a: &toml::Value, b: &toml::Value, depth: usize, out: &mut Vec<String>) {
    use toml::Value;
    if a == b {
        return;
    }
    let join = |k: &str| if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") };
    match (a, b) {
        (Value::Table(x), Value::Table(y)) if depth < 2 => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => diff(&join(k), p, q, depth + 1, out),
                    _ => out.push(join(k)),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() && depth < 2 && x.iter().all(Value::is_table) => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{prefix}[{i}]"), p, q, depth, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_names_what_waits_for_a_restart_and_not_what_it_applies() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("acl.toml"), "").unwrap();
        let parse = |text: &str| EdgeConfig::from_toml(text, dir.path()).unwrap();
        let base = "[[listener]]\nname = \"local\"\nbind = \"127.0.0.1:1883\"\nanonymous = true\n";
        let old = parse(base);
        assert!(old.restart_needed(&parse(base)).is_empty());
        let now = parse(&format!(
            "{base}[auth]\nacl_file = \"acl.toml\"\n[spool]\nbudget = \"1GiB\"\n[probe]\ninterval = \"5s\"\n\
             [log]\nlevel = \"debug\"\nformat = \"json\"\n"
        ));
        assert_eq!(
            now.restart_needed(&old),
            ["log.format", "probe.interval", "spool.budget"],
            "auth and the log level are applied live"
        );
        let moved = parse(&base.replace("1883", "1884"));
        assert_eq!(old.restart_needed(&moved), ["listener[0].bind"]);
        // The runtime is built once, before the node starts.
        let one = parse(&format!("{base}[runtime]\nworker_threads = 1\n"));
        assert_eq!(old.restart_needed(&one), ["runtime.worker_threads"]);
    }
}
